// One process as a group of one; see include/cohort/dist/comm.hpp.
#include <sched.h>

#include <cstdlib>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/dist/comm.hpp"

namespace cohort::dist {

namespace {
class LocalComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "one process"; }
  Handle isend(const void*, std::size_t, int, int) override { refuse(); }
  Handle irecv(void*, std::size_t, int, int) override { refuse(); }
  void wait(std::span<const Handle> handles) override {
    if (!handles.empty()) refuse();
  }
  void wait_all() override {}
  void allgatherv(void*, std::span<const std::size_t>) override {}  // the one part is in place
  std::uint64_t sum(std::uint64_t value) override { return value; }
  [[noreturn]] void abort(int code) override { std::exit(code); }

 private:
  [[noreturn]] static void refuse() {
    throw InternalError("a message within one process (LocalComm has no peers)");
  }
};
}  // namespace

std::unique_ptr<Comm> local_comm() { return std::make_unique<LocalComm>(); }

std::size_t affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<std::size_t>(n);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

#ifndef COHORT_HAVE_MPI
bool built_with_mpi() { return false; }
std::unique_ptr<Comm> world(int*, char***) { return local_comm(); }
#endif

}  // namespace cohort::dist
