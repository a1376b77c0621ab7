// The process group a run belongs to: one process (LocalComm), or the ranks of an MPI job
// (src/dist/mpi_comm.cpp, built with COHORT_MPI). The engine sees only this narrow interface —
// non-blocking byte messages, two small collectives and abort — so nothing outside src/dist
// includes MPI, and a build without MPI is the same engine with LocalComm.
//
// Thread-safety: every call but abort() is made by one thread, the controller (the thread that
// created the world); the MPI implementation also works under MPI_THREAD_MULTIPLE, which it
// requires so that abort() may come from any thread (the stall watchdog).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace cohort::dist {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The ranks on this rank's node (MPI_COMM_TYPE_SHARED) and this rank's index among them.
  virtual int local_rank() const { return 0; }
  virtual int local_size() const { return 1; }
  // One line for the run's header, e.g. "MPI: Open MPI v4.1.4, 2 ranks on 1 node".
  virtual std::string describe() const = 0;

  // Non-blocking messages of raw bytes. A posted buffer must stay valid and untouched until the
  // handle returned is completed by wait(). Messages between two ranks with the same tag arrive
  // in the order they were posted.
  using Handle = std::size_t;
  virtual Handle isend(const void* data, std::size_t bytes, int to, int tag) = 0;
  virtual Handle irecv(void* data, std::size_t bytes, int from, int tag) = 0;
  // Completes the given handles (and forgets them).
  virtual void wait(std::span<const Handle> handles) = 0;
  // Completes every posted handle.
  virtual void wait_all() = 0;
  // Lets posted messages move without waiting for them (MPI moves large messages only inside
  // MPI calls). Unlike the calls above, any thread may call it, at any time.
  virtual void progress() {}

  // In place: rank r's `bytes[r]` bytes lie at offset bytes[0] + ... + bytes[r-1] of `data`;
  // afterwards every rank has every part. Parts and their sum may exceed what one MPI call
  // carries (gather_pieces).
  virtual void allgatherv(void* data, std::span<const std::size_t> bytes) = 0;
  // The sum over ranks (exact: integers).
  virtual std::uint64_t sum(std::uint64_t value) = 0;

  // Ends the whole job with `code` (MPI_Abort); the caller has printed why.
  [[noreturn]] virtual void abort(int code) = 0;

  // Bytes this rank has posted for sending since the start (isend and its part of allgatherv
  // times the ranks it goes to).
  std::uint64_t bytes_sent() const { return bytes_sent_; }

 protected:
  std::uint64_t bytes_sent_ = 0;
};

// An in-place all-gather (Comm::allgatherv's `bytes`) as calls that each move at most `limit`
// bytes, their offsets included (MPI 3 counts and displaces in int: limit INT_MAX). Empty when
// the whole gather fits one all-gather call; else each rank's part, in rank order, broadcast
// from that rank in pieces of at most `limit` bytes (none for an empty part).
struct GatherPiece {
  int root;
  std::size_t offset, bytes;
};
std::vector<GatherPiece> gather_pieces(std::span<const std::size_t> bytes, std::size_t limit);

// One process: rank 0 of 1. Messages to itself are not supported (nothing sends them).
std::unique_ptr<Comm> local_comm();

// Whether this build has MPI (COHORT_MPI), e.g. for --help.
bool built_with_mpi();

// The world of this process: MPI's when built with MPI and started by an MPI launcher
// (mpirun/srun set OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_SIZE), else local_comm(). Throws
// InputError if MPI grants less than MPI_THREAD_MULTIPLE. MPI is finalized when the last world
// object is destroyed. COHORT_MPI_GATHER_LIMIT=N (bytes, for tests) makes the all-gathers go in
// pieces of at most N bytes, as they do past INT_MAX; InputError if N is not a positive integer.
std::unique_ptr<Comm> world(int* argc, char*** argv);

// The cores this process may run on (its CPU affinity mask), at least 1.
std::size_t affinity_cores();

}  // namespace cohort::dist
