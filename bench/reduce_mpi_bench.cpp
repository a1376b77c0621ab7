// The reduction across MPI ranks, beside the collectives a cluster already has: one step sums
// every rank's leaves (L = leaves-per-rank x R gradients of N floats) into every rank's copy.
//   mpi_allreduce   each rank sums its own leaves, then MPI_Allreduce (MPI_SUM, in place)
//   mpi_rs_ag       each rank sums its own leaves, then MPI_Reduce_scatter_block + MPI_Allgather
//   cohort          the sharded root's exchange (src/train/sharded.hpp) through dist::Comm: each
//                   rank sends every leaf's slice of an owner's shard to that owner, the owner
//                   sums its shard's slices in leaf order (reduce::sum_sources), then sends the
//                   summed shard to every rank: bitwise the same for every rank count
// Run under mpirun (bench/run_reduce_bench.py does): every rank runs the same fixed iteration
// count, since a collective whose ranks chose their own counts would deadlock. Rank 0 prints one
// JSON object a line per (strategy, size): the step's seconds as the slowest rank saw them
// (median, min, max over repetitions). Every rank checks its sum against a float64 serial sum
// after the timing; a wrong sum on any rank is exit 1.
//
//   mpirun -np R reduce_mpi_bench --sizes=BYTES,... [--iters=N] [--reps=K] [--leaves-per-rank=2]
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cohort/dist/comm.hpp"
#include "cohort/reduce/kernels.hpp"
#include "cohort/tensor/buffer.hpp"

namespace {

using cohort::AlignedBuffer;

struct Options {
  std::vector<long long> sizes;
  long long iters = 20, reps = 5, leaves_per_rank = 2;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "reduce_mpi_bench: %s\nusage: mpirun -np R reduce_mpi_bench --sizes=BYTES,... "
               "[--iters=N] [--reps=K] [--leaves-per-rank=L]\n",
               problem.c_str());
  std::exit(2);
}

long long positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v <= 0)
    usage(flag + ": expected a positive integer, found '" + text + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::size_t eq = arg.find('=');
    const std::string flag = arg.substr(0, eq),
                      value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (flag == "--sizes") {
      for (std::size_t at = 0; at <= value.size();) {
        const std::size_t comma = std::min(value.find(',', at), value.size());
        o.sizes.push_back(positive("--sizes", value.substr(at, comma - at)));
        at = comma + 1;
      }
    } else if (flag == "--iters") {
      o.iters = positive(flag, value);
    } else if (flag == "--reps") {
      o.reps = positive(flag, value);
    } else if (flag == "--leaves-per-rank") {
      o.leaves_per_rank = positive(flag, value);
    } else {
      usage("unknown argument '" + arg + "'");
    }
  }
  if (o.sizes.empty()) usage("--sizes: expected at least one size");
  return o;
}

// Leaf l's value at element i: the same formula as reduce_bench's leaves.
float leaf_value(std::size_t l, std::size_t i) {
  return static_cast<float>((i + l) % 1024) * 0.001f;
}

struct Step {
  const char* name;
  std::function<void()> run;
  const float* result;
};

}  // namespace

int main(int argc, char** argv) {
  const std::unique_ptr<cohort::dist::Comm> comm = cohort::dist::world(&argc, &argv);
  const Options o = parse(argc, argv);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) usage("expected to run under mpirun (MPI is not initialized)");
  const auto R = static_cast<std::size_t>(comm->size());
  const auto me = static_cast<std::size_t>(comm->rank());
  const auto per_rank = static_cast<std::size_t>(o.leaves_per_rank);
  const std::size_t L = per_rank * R;
  bool all_correct = true;
  for (const long long bytes : o.sizes) {
    const std::size_t n = static_cast<std::size_t>(bytes) / sizeof(float);
    const std::size_t shard = (n + R - 1) / R;  // each owner's floats (the last may hold fewer)
    auto shard_begin = [&](std::size_t r) { return std::min(n, r * shard); };
    auto shard_end = [&](std::size_t r) { return std::min(n, (r + 1) * shard); };
    // This rank's leaves: global leaves me * per_rank .. (me + 1) * per_rank - 1.
    std::vector<AlignedBuffer<float>> leaves;
    std::vector<const float*> own;
    for (std::size_t k = 0; k < per_rank; ++k) {
      leaves.emplace_back(n);
      for (std::size_t i = 0; i < n; ++i) leaves.back()[i] = leaf_value(me * per_rank + k, i);
      own.push_back(leaves.back().data());
    }
    AlignedBuffer<float> sum(shard * R), part(shard), gathered(shard * R);
    // cohort: the owner's receive buffers, one slice per leaf (its own leaves' slices are read in
    // place), and the whole result.
    AlignedBuffer<float> slices(L * shard), result(n);
    const int count = static_cast<int>(shard);
    const std::vector<Step> steps = {
        {"mpi_allreduce",
         [&] {
           cohort::reduce::sum_sources(sum.data(), own.data(), own.size(), n);
           MPI_Allreduce(MPI_IN_PLACE, sum.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD);
         },
         sum.data()},
        {"mpi_rs_ag",
         [&] {
           cohort::reduce::sum_sources(sum.data(), own.data(), own.size(), n);
           MPI_Reduce_scatter_block(sum.data(), part.data(), count, MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
           MPI_Allgather(part.data(), count, MPI_FLOAT, gathered.data(), count, MPI_FLOAT,
                         MPI_COMM_WORLD);
         },
         gathered.data()},
        {"cohort",
         [&] {
           std::vector<cohort::dist::Comm::Handle> posted;
           const std::size_t mine = shard_end(me) - shard_begin(me);
           // Phase 1: every leaf's slice of each other owner's shard, to that owner.
           for (std::size_t l = 0; l < L; ++l) {
             const std::size_t from = l / per_rank;
             if (from == me) continue;
             posted.push_back(comm->irecv(slices.data() + l * shard, mine * sizeof(float),
                                          static_cast<int>(from), static_cast<int>(l)));
           }
           for (std::size_t r = 0; r < R; ++r) {
             if (r == me) continue;
             for (std::size_t k = 0; k < per_rank; ++k)
               posted.push_back(comm->isend(
                   own[k] + shard_begin(r), (shard_end(r) - shard_begin(r)) * sizeof(float),
                   static_cast<int>(r), static_cast<int>(me * per_rank + k)));
           }
           comm->wait(posted);
           posted.clear();
           // The owner's sum, in leaf order.
           std::vector<const float*> src(L);
           for (std::size_t l = 0; l < L; ++l)
             src[l] = l / per_rank == me ? own[l % per_rank] + shard_begin(me)
                                         : slices.data() + l * shard;
           cohort::reduce::sum_sources(result.data() + shard_begin(me), src.data(), L, mine);
           // Phase 2: the summed shard to every rank.
           for (std::size_t r = 0; r < R; ++r) {
             if (r == me) continue;
             posted.push_back(comm->irecv(result.data() + shard_begin(r),
                                          (shard_end(r) - shard_begin(r)) * sizeof(float),
                                          static_cast<int>(r), static_cast<int>(L)));
             posted.push_back(comm->isend(result.data() + shard_begin(me), mine * sizeof(float),
                                          static_cast<int>(r), static_cast<int>(L)));
           }
           comm->wait(posted);
         },
         result.data()},
    };
    for (const Step& s : steps) {
      s.run();  // warm-up
      std::vector<double> seconds;
      for (long long rep = 0; rep < o.reps; ++rep) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (long long it = 0; it < o.iters; ++it) s.run();
        double t = (MPI_Wtime() - t0) / static_cast<double>(o.iters), slowest = 0;
        MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        seconds.push_back(slowest);
      }
      // The check: every element against the float64 serial sum of all L leaves.
      long long wrong_at = -1;
      for (std::size_t i = 0; i < n && wrong_at < 0; ++i) {
        double ref = 0, magnitude = 0;
        for (std::size_t l = 0; l < L; ++l) {
          ref += leaf_value(l, i);
          magnitude += std::fabs(leaf_value(l, i));
        }
        if (!(std::fabs(static_cast<double>(s.result[i]) - ref) <=
              1e-6 * static_cast<double>(L) * magnitude + 1e-30))
          wrong_at = static_cast<long long>(i);
      }
      long long first_wrong = wrong_at < 0 ? -1 : wrong_at, any = 0;
      const long long mine_wrong = wrong_at < 0 ? 0 : 1;
      MPI_Allreduce(&mine_wrong, &any, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &first_wrong, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
      all_correct = all_correct && any == 0;
      std::sort(seconds.begin(), seconds.end());
      if (me == 0) {
        std::printf(
            "{\"strategy\": \"%s\", \"ranks\": %zu, \"bytes\": %lld, \"leaves\": %zu, "
            "\"iters\": %lld, \"reps\": %lld, \"seconds_median\": %.9g, \"seconds_min\": %.9g, "
            "\"seconds_max\": %.9g, \"correct\": %s",
            s.name, R, bytes, L, o.iters, o.reps, seconds[seconds.size() / 2], seconds.front(),
            seconds.back(), any == 0 ? "true" : "false");
        if (any != 0)
          std::printf(", \"error\": \"wrong sum on %lld rank(s), element %lld\"", any, first_wrong);
        std::printf("}\n");
        std::fflush(stdout);
      }
    }
  }
  return all_correct ? 0 : 1;
}
