// An in-process process group for tests: R "ranks" are R threads of one process, each with its
// own ThreadComm over one shared ThreadWorld. Messages are copied when sent (MPI's buffered
// semantics) and matched per (sender, receiver, tag) in the order receives were posted, as MPI
// matches them; the collectives are barriers over a shared buffer. So the sharded trainer's
// exchange runs, without MPI, under every sanitizer, against the one-process oracle.
#pragma once

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/dist/comm.hpp"

namespace cohort::train::testing {

class ThreadWorld {
 public:
  explicit ThreadWorld(int size) : size_(size) {}
  int size() const { return size_; }

  void post(int from, int to, int tag, const void* data, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    const auto* p = static_cast<const char*>(data);
    mail_.push_back({from, to, tag, std::vector<char>(p, p + bytes)});
    cv_.notify_all();
  }
  // Blocks until a message from `from` to `to` with `tag` is there; takes the oldest.
  std::vector<char> take(int from, int to, int tag) {
    std::unique_lock lock(mutex_);
    for (;;) {
      for (auto it = mail_.begin(); it != mail_.end(); ++it)
        if (it->from == from && it->to == to && it->tag == tag) {
          std::vector<char> data = std::move(it->data);
          mail_.erase(it);
          return data;
        }
      cv_.wait(lock);
    }
  }
  // Every rank's part into every rank's `data` (bytes[r] at the running offset).
  void allgatherv(int rank, void* data, std::span<const std::size_t> bytes) {
    std::size_t offset = 0, total = 0;
    for (std::size_t r = 0; r < bytes.size(); ++r) {
      if (static_cast<int>(r) < rank) offset += bytes[r];
      total += bytes[r];
    }
    std::unique_lock lock(mutex_);
    const std::uint64_t generation = generation_;
    if (arrived_ == 0) shared_.assign(total, 0);
    std::memcpy(shared_.data() + offset, static_cast<char*>(data) + offset,
                bytes[static_cast<std::size_t>(rank)]);
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      result_ = shared_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
    std::memcpy(data, result_.data(), total);
    // The next collective starts only when everyone has copied this one out.
    if (++left_ == size_) {
      left_ = 0;
      ++exit_generation_;
      cv_.notify_all();
    } else {
      const std::uint64_t exit_generation = exit_generation_;
      cv_.wait(lock, [&] { return exit_generation_ != exit_generation; });
    }
  }

 private:
  struct Message {
    int from, to, tag;
    std::vector<char> data;
  };
  const int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Message> mail_;
  std::vector<char> shared_, result_;
  int arrived_ = 0, left_ = 0;
  std::uint64_t generation_ = 0, exit_generation_ = 0;
};

class ThreadComm final : public dist::Comm {
 public:
  ThreadComm(ThreadWorld& world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  std::string describe() const override { return "threads"; }

  Handle isend(const void* data, std::size_t bytes, int to, int tag) override {
    COHORT_CHECK(to != rank_ && to >= 0 && to < size(), "a message to another rank");
    world_.post(rank_, to, tag, data, bytes);
    bytes_sent_ += bytes;
    pending_.push_back({nullptr, 0, -1, 0, true});  // complete: copied
    return pending_.size() - 1;
  }
  Handle irecv(void* data, std::size_t bytes, int from, int tag) override {
    COHORT_CHECK(from != rank_ && from >= 0 && from < size(), "a message from another rank");
    pending_.push_back({data, bytes, from, tag, false});
    return pending_.size() - 1;
  }
  void wait(std::span<const Handle> handles) override {
    for (Handle h : handles) complete(h);
  }
  void wait_all() override {
    for (Handle h = 0; h < pending_.size(); ++h) complete(h);
    pending_.clear();
  }
  void allgatherv(void* data, std::span<const std::size_t> bytes) override {
    world_.allgatherv(rank_, data, bytes);
    bytes_sent_ += bytes[static_cast<std::size_t>(rank_)] * static_cast<std::size_t>(size() - 1);
  }
  std::uint64_t sum(std::uint64_t value) override {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size()));
    all[static_cast<std::size_t>(rank_)] = value;
    const std::vector<std::size_t> bytes(all.size(), sizeof(std::uint64_t));
    world_.allgatherv(rank_, all.data(), bytes);
    std::uint64_t total = 0;
    for (std::uint64_t v : all) total += v;
    return total;
  }
  [[noreturn]] void abort(int) override { throw InternalError("ThreadComm::abort"); }

 private:
  struct Pending {
    void* data;
    std::size_t bytes;
    int from, tag;
    bool done;
  };
  // Receives from one (sender, tag) match messages in posting order: complete the earlier ones
  // of the same pair first.
  void complete(Handle h) {
    if (pending_.at(h).done) return;
    for (Handle e = 0; e <= h; ++e) {
      Pending& p = pending_[e];
      if (p.done || p.from != pending_[h].from || p.tag != pending_[h].tag) continue;
      const std::vector<char> data = world_.take(p.from, rank_, p.tag);
      COHORT_CHECK(data.size() == p.bytes, "a message of the posted size");
      std::memcpy(p.data, data.data(), data.size());
      p.done = true;
    }
  }

  ThreadWorld& world_;
  const int rank_;
  std::vector<Pending> pending_;
};

}  // namespace cohort::train::testing
