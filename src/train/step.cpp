// One training step: replicas claim and compute the leaves (assembling their rows, or finding
// them staged ahead), the exchange (exchange.hpp: the local reduction tree, or the ranks' sharded
// root) brings their sum to the root, which applies the optimizer, fused or after the whole
// gradient is checked and measured; a non-finite loss or gradient stops or skips the step. The
// trainer's state: trainer_impl.hpp.
#include "trainer_impl.hpp"

namespace cohort::train {

namespace {
// Rethrows the exception in flight with the step number: InputError stays InputError (exit 2),
// anything else becomes InternalError (exit 1).
[[noreturn]] void rethrow_at_step(std::uint64_t step) {
  const std::string where = "step " + std::to_string(step) + ": ";
  try {
    throw;
  } catch (const InputError& e) {
    throw InputError(where + e.what());
  } catch (const std::exception& e) {
    throw InternalError(where + e.what());
  }
}
}  // namespace

void Trainer::Impl::run_replica(std::size_t w) {
  if (w >= plan.workers) return;
  Replica& r = graph.replica(w);
  const auto track = static_cast<std::uint32_t>(w);
  tracer.enter_replica(track);
  try {
    for (;;) {
      // A chain's buffer is taken before the claim (leaf_chain.hpp: why that cannot deadlock).
      float* chained = nullptr;
      if (chain) {
        const auto t0 = Clock::now();
        chained = chain->acquire();
        r.clock.reduce += seconds_since(t0);
        if (!chained) break;  // another replica failed: the step is aborted
      }
      // relaxed: the counter only hands out distinct indices; the plan was published to this
      // node by the graph's start message.
      const std::size_t leaf =
          plan.first_leaf + plan.next_leaf.fetch_add(1, std::memory_order_relaxed);
      if (leaf >= plan.end_leaf) {
        if (chained) chain->release(chained);
        break;
      }
      compute_leaf(r, track, leaf, chained ? chained : leaf_grads[leaf].data());
      if (!plan.reducer) continue;  // the exchange takes the leaves from their buffers
      const auto t0 = Clock::now();
      if (chained) {
        chain_leaf(leaf, chained);
      } else {
        ReducerCall call;
        plan.contributing.fetch_add(1, std::memory_order_relaxed);
        plan.reducer->contribute(w, leaf, leaf_grads[leaf].data());
      }
      r.clock.reduce += seconds_since(t0);
      if (tracer.on()) tracer.record("combine", track, "leaf", leaf, t0, Clock::now());
    }
    if (!plan.reducer) return;
    stage_ahead(r, track);
    if (chain) return;  // the chain's reducer has one worker, and the tree's finish does nothing
    const auto t0 = Clock::now();
    {
      ReducerCall call;
      plan.reducer->finish(w);
    }
    r.clock.reduce += seconds_since(t0);
  } catch (...) {
    if (plan.reducer) plan.reducer->abort_step();
    if (chain) chain->abort();
    throw;
  }
}

void Trainer::Impl::chain_leaf(std::size_t leaf, float* grad) {
  ReducerCall call;
  plan.contributing.fetch_add(1, std::memory_order_relaxed);
  if (const float* sum = chain->complete(leaf, grad)) plan.reducer->contribute(0, 0, sum);
}

void Trainer::Impl::stage_ahead(Replica& r, std::uint32_t track) {
  while (plan.contributing.load(std::memory_order_relaxed) < plan.leaves) {
    const auto t0 = Clock::now();
    if (!staging.stage_ahead()) return;
    r.clock.data += seconds_since(t0);
    if (tracer.on()) tracer.record("stage ahead", track, nullptr, 0, t0, Clock::now());
  }
}

void Trainer::Impl::compute_leaf(Replica& r, std::uint32_t track, std::size_t leaf, float* grad) {
  const std::size_t first = leaf * config.micro_batch;
  const std::size_t n = std::min(config.micro_batch, plan.ids.size() - first);
  const auto t0 = Clock::now();
  const bool assembled = staging.stage(first, n) > 0;
  r.clock.data += seconds_since(t0);
  const auto t1 = Clock::now();
  if (tracer.on() && assembled) tracer.record("data", track, "leaf", leaf, t0, t1);
  if (config.leaf_hook) config.leaf_hook(plan.number, leaf);
  if (batch_grads) batch_grads->leaf_rows(first, r.linear_rows);
  const nn::StreamKey key{config.seed, plan.number, leaf};  // dropout: never keyed by worker
  const auto rows = batch_grads ? std::span<const nn::LinearRows>(r.linear_rows)
                                : std::span<const nn::LinearRows>();
  const auto N = static_cast<std::int64_t>(n);
  float* batch_stats = bn_stats.leaf(leaf);
  const std::int32_t* y = staging.y() + first;
  leaf_loss[leaf] = !bf16_run()
                        ? r.net.forward_backward(weights.data(), staging.x() + first * features, y,
                                                 N, grad, key, rows, batch_stats)
                    : staging.bf16_rows()
                        ? r.net.forward_backward(weights16.data(), staging.x16() + first * features,
                                                 y, N, grad, key, rows, batch_stats)
                        : r.net.forward_backward(weights16.data(), staging.x() + first * features,
                                                 y, N, grad, key, rows, batch_stats);
  if (tracer.on()) {
    tracer.record("forward", track, "leaf", leaf, t1, r.net.backward_begin());
    tracer.record("backward", track, "leaf", leaf, r.net.backward_begin(), Clock::now());
  }
  if (config.gradient_hook) config.gradient_hook(plan.number, leaf, grad, model.layout().total());
  // A non-finite loss must never reach the weights. Stopping: fail the step before
  // contributing, so the root (the only writer) never runs. Skipping: the two-phase root sees
  // the loss and applies nothing.
  if (!std::isfinite(leaf_loss[leaf]) && config.on_nonfinite == TrainConfig::OnNonFinite::kStop)
    throw InternalError("non-finite loss (" + std::to_string(leaf_loss[leaf]) + ") in leaf " +
                        std::to_string(leaf) + "; the weights are those after step " +
                        std::to_string(plan.number - 1));
}

StepOutcome Trainer::Impl::step(const Staging::Step& current, const Staging::Step& next) {
  const std::size_t rows = current.ids.size();
  plan.ids = current.ids;
  plan.leaves = leaves_for(rows);
  staging.begin_step(current, exchange->stages_ahead() ? next : Staging::Step{});
  tracer.begin_step(plan.number);
  StepOutcome out;
  out.lr = optim::lr_at(config.schedule, base_lr, updates_done, total_steps);
  const float inv_rows = 1.0f / static_cast<float>(rows);
  root.begin_step(optimizer.scalars(out.lr, inv_rows, updates_done + 1), rows, staging.input());
  const dist::Range mine = exchange->begin_step(rows, plan.leaves);  // this process's leaves
  plan.first_leaf = mine.begin;
  plan.end_leaf = mine.end;
  plan.reducer = exchange->reducer();
  plan.workers = std::min(config.workers, mine.size());
  plan.next_leaf.store(0, std::memory_order_relaxed);  // ordered before the nodes by try_put
  plan.contributing.store(0, std::memory_order_relaxed);
  try {
    graph.run_replicas([this](std::size_t w) { run_replica(w); });
    exchange->reduce(graph.executor(), run_observer && run_observer->stop_requested(),
                     [&] { assemble_other_ranks_rows(); });
  } catch (...) {
    exchange->abort();
    rethrow_at_step(plan.number);
  }
  time.add_root(root.stats(), root.mode() == Root::Mode::kFused);
  for (std::size_t leaf = 0; leaf < plan.leaves; ++leaf) out.loss += leaf_loss[leaf];
  out.loss /= static_cast<double>(rows);  // in leaf order
  if (std::string reason = non_finite_reason(); !reason.empty()) {
    out = refuse(out, reason);  // (or throws: the run stops)
  } else if (root.mode() == Root::Mode::kTwoPhase) {
    out.grad_norm = apply_second_phase(out.lr, inv_rows);
  }
  if (!out.skipped) bn_stats.fold(rows, config.micro_batch, comm);  // in leaf order
  time.add_exchange(exchange->end_step());
  return out;
}

void Trainer::Impl::assemble_other_ranks_rows() {
  if (!batch_grads) return;
  const std::size_t rows = plan.ids.size();
  constexpr std::size_t kRowsBetweenProgress = 32;  // the messages move while rows are staged
  auto assemble = [&](std::size_t first, std::size_t last) {
    last = std::min(last, rows);
    for (std::size_t at = first; at < last; at += kRowsBetweenProgress) {
      staging.stage(at, std::min(kRowsBetweenProgress, last - at));
      comm.progress();
    }
  };
  assemble(0, plan.first_leaf * config.micro_batch);
  assemble(plan.end_leaf * config.micro_batch, rows);
}

double Trainer::Impl::apply_second_phase(float lr, float inv_rows) {
  const double norm = std::sqrt(root.sum_squares()) * static_cast<double>(inv_rows);
  double clip = 1.0;
  if (config.clip_norm > 0)
    clip = std::min(1.0, static_cast<double>(config.clip_norm) / (norm + 1e-6));
  const auto t0 = Clock::now();
  const dist::Range owned = exchange->owned_chunks();
  root.apply_summed(optimizer.scalars(lr, static_cast<float>(inv_rows * clip), updates_done + 1),
                    graph.executor(), owned.begin, owned.end);
  exchange->share_weights();
  time.add_second_phase(root.stats(), seconds_since(t0));
  return norm;
}

StepOutcome Trainer::Impl::refuse(StepOutcome out, const std::string& reason) {
  const std::string at = "step " + std::to_string(plan.number) + ": " + reason;
  if (root.mode() == Root::Mode::kFused)
    throw InternalError(at +
                        "; the run stops (blocks with finite gradients were applied; "
                        "nothing is saved from this state)");
  if (config.on_nonfinite == TrainConfig::OnNonFinite::kStop)
    throw InternalError(at + "; the weights are those after step " +
                        std::to_string(plan.number - 1));
  out.skipped = true;
  out.skip_reason = reason;
  return out;
}

std::string Trainer::Impl::tensor_of(std::size_t i) const {
  for (const auto& e : model.layout().entries())
    if (i >= e.offset && i < e.offset + e.shape.numel())
      return e.name + "[" + std::to_string(i - e.offset) + "]";
  return "padding[" + std::to_string(i) + "]";
}

std::string Trainer::Impl::non_finite_reason() const {
  for (std::size_t leaf = 0; leaf < plan.leaves; ++leaf)
    if (!std::isfinite(leaf_loss[leaf]))
      return "non-finite loss (" + std::to_string(leaf_loss[leaf]) + ") in leaf " +
             std::to_string(leaf);
  if (const std::size_t i = root.first_non_finite(); i != model.layout().total())
    return "non-finite gradient in " + tensor_of(i);
  return "";
}

void Trainer::Impl::end_step_accounts(double wall) {
  for (std::size_t w = 0; w < graph.workers(); ++w)
    time.add_replica(graph.replica(w).clock, graph.replica(w).net);
  time.end_step(wall, config.workers);
}

}  // namespace cohort::train
