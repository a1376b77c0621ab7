// The ranks of an MPI job (Open MPI); see include/cohort/dist/comm.hpp. Built with COHORT_MPI.
#include <mpi.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/dist/comm.hpp"

namespace cohort::dist {

namespace {
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw InternalError(std::string(what) + ": " + std::string(text, static_cast<std::size_t>(len)));
}

int count_of(std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw InternalError("an MPI message of " + std::to_string(bytes) + " bytes (at most 2 GiB)");
  return static_cast<int>(bytes);
}

class MpiComm final : public Comm {
 public:
  // gather_limit: the most bytes one MPI call of allgatherv moves (counts and offsets).
  explicit MpiComm(std::size_t gather_limit) : gather_limit_(gather_limit) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_),
          "MPI_Comm_split_type");
    MPI_Comm_rank(node_, &local_rank_);
    MPI_Comm_size(node_, &local_size_);
    // Nodes: the ranks that are local rank 0.
    int leader = local_rank_ == 0 ? 1 : 0;
    MPI_Allreduce(&leader, &nodes_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  }
  ~MpiComm() override {
    MPI_Comm_free(&node_);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<std::size_t>(len));
    if (const auto comma = v.find(','); comma != std::string::npos) v.resize(comma);
    return "MPI (" + v + "), " + std::to_string(size_) + " ranks on " + std::to_string(nodes_) +
           (nodes_ == 1 ? " node" : " nodes");
  }

  Handle isend(const void* data, std::size_t bytes, int to, int tag) override {
    MPI_Request r;
    check(MPI_Isend(data, count_of(bytes), MPI_BYTE, to, tag, MPI_COMM_WORLD, &r), "MPI_Isend");
    bytes_sent_ += bytes;
    return remember(r);
  }
  Handle irecv(void* data, std::size_t bytes, int from, int tag) override {
    MPI_Request r;
    check(MPI_Irecv(data, count_of(bytes), MPI_BYTE, from, tag, MPI_COMM_WORLD, &r), "MPI_Irecv");
    return remember(r);
  }
  void wait(std::span<const Handle> handles) override {
    scratch_.clear();
    for (Handle h : handles) scratch_.push_back(requests_.at(h));
    check(MPI_Waitall(static_cast<int>(scratch_.size()), scratch_.data(), MPI_STATUSES_IGNORE),
          "MPI_Waitall");
    for (Handle h : handles) requests_[h] = MPI_REQUEST_NULL;
  }
  void wait_all() override {
    check(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE),
          "MPI_Waitall");
    requests_.clear();
  }

  void progress() override {
    // Any MPI call runs the progress engine; a probe touches no request of ours, so any thread
    // may make it (MPI_THREAD_MULTIPLE).
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
  }

  void allgatherv(void* data, std::span<const std::size_t> bytes) override {
    COHORT_CHECK(bytes.size() == static_cast<std::size_t>(size_), "allgatherv: a size per rank");
    const std::vector<GatherPiece> pieces = gather_pieces(bytes, gather_limit_);
    if (pieces.empty()) {
      std::vector<int> counts(bytes.size()), offsets(bytes.size());
      std::size_t at = 0;
      for (std::size_t r = 0; r < bytes.size(); ++r) {
        counts[r] = count_of(bytes[r]);
        offsets[r] = count_of(at);
        at += bytes[r];
      }
      check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), offsets.data(),
                           MPI_BYTE, MPI_COMM_WORLD),
            "MPI_Allgatherv");
    } else {
      // Too large for int counts and offsets: each part from its rank, piece by piece.
      for (const GatherPiece& p : pieces)
        check(MPI_Bcast(static_cast<char*>(data) + p.offset, count_of(p.bytes), MPI_BYTE, p.root,
                        MPI_COMM_WORLD),
              "MPI_Bcast");
    }
    bytes_sent_ += bytes[static_cast<std::size_t>(rank_)] * static_cast<std::size_t>(size_ - 1);
  }
  std::uint64_t sum(std::uint64_t value) override {
    std::uint64_t total = 0;
    check(MPI_Allreduce(&value, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    return total;
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // not reached
  }

 private:
  Handle remember(MPI_Request r) {
    requests_.push_back(r);
    return requests_.size() - 1;
  }

  std::size_t gather_limit_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, nodes_ = 1;
  MPI_Comm node_ = MPI_COMM_NULL;
  std::vector<MPI_Request> requests_;  // posted this round; MPI_REQUEST_NULL once waited
  std::vector<MPI_Request> scratch_;
};

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}
}  // namespace

bool built_with_mpi() { return true; }

std::unique_ptr<Comm> world(int* argc, char*** argv) {
  if (!launched_by_mpi()) return local_comm();
  std::size_t gather_limit = INT_MAX;
  if (const char* limit = std::getenv("COHORT_MPI_GATHER_LIMIT")) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(limit, &end, 10);
    if (*limit < '0' || *limit > '9' || *end != '\0' || errno != 0 || n == 0 || n > INT_MAX)
      throw InputError(std::string("COHORT_MPI_GATHER_LIMIT: expected bytes from 1 to ") +
                       std::to_string(INT_MAX) + ", found '" + limit + "'");
    gather_limit = static_cast<std::size_t>(n);
  }
  int provided = MPI_THREAD_SINGLE;
  check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw InputError("MPI: this MPI library grants thread level " + std::to_string(provided) +
                     ", cohort needs MPI_THREAD_MULTIPLE (" + std::to_string(MPI_THREAD_MULTIPLE) +
                     "): the stall watchdog and error handling may end the job from any thread");
  }
  // Errors come back as codes (checked above), not as MPI's default abort without a message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::make_unique<MpiComm>(gather_limit);
}

}  // namespace cohort::dist
