// `cohort sample`: a language model's checkpoint, a prompt encoded with its vocabulary, and tokens
// drawn one at a time from the model's next-token distribution (temperature, top-k), each from a
// stream keyed by (seed, the index of the generated token): the same text for the same seed.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "cohort/data/text.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/tokenizer/bpe.hpp"
#include "commands.hpp"
#include "options.hpp"

namespace cohort::cli {

namespace {

// The prompt's tokens: its characters through the vocabulary (text), or token ids separated by
// spaces (a vocabulary of token arrays). Empty: a newline, as nanoGPT's sample.py starts, or
// token 0 where the vocabulary has none.
std::vector<std::int32_t> encode_prompt(const std::string& prompt,
                                        const checkpoint::Checkpoint& c) {
  std::vector<std::int32_t> tokens;
  const auto& chars = c.characters;
  if (chars.empty()) {
    std::istringstream ids(prompt);
    for (std::string id; ids >> id;) {
      std::uint64_t v = 0;
      const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), v);
      if (ec != std::errc() || end != id.data() + id.size() || v >= c.vocab)
        throw InputError("--prompt: expected token ids below " + std::to_string(c.vocab) +
                         " separated by spaces (the checkpoint's vocabulary came from token "
                         "arrays), found '" +
                         id + "'");
      tokens.push_back(static_cast<std::int32_t>(v));
    }
    if (tokens.empty()) tokens.push_back(0);
    return tokens;
  }
  const std::string text = prompt.empty() ? "\n" : prompt;
  const std::vector<std::uint32_t> points = data::decode_utf8(
      {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}, "--prompt");
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto it = std::lower_bound(chars.begin(), chars.end(), points[i]);
    if (it == chars.end() || *it != points[i]) {
      if (prompt.empty()) return {0};
      char code[16];
      std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(points[i]));
      throw InputError("--prompt: character " + std::to_string(i + 1) + " '" +
                       data::encode_utf8(points[i]) + "' (" + code +
                       "): expected one of the checkpoint's " + std::to_string(chars.size()) +
                       " characters, found one it never saw");
    }
    tokens.push_back(static_cast<std::int32_t>(it - chars.begin()));
  }
  return tokens;
}

// The prompt's tokens through a BPE tokenizer; empty: GPT-2's "<|endoftext|>" where the
// vocabulary has it (as GPT-2's samples start), else a newline. Every token must be one of the
// checkpoint's.
std::vector<std::int32_t> encode_prompt(const std::string& prompt, const tokenizer::Bpe& bpe,
                                        const checkpoint::Checkpoint& c) {
  const std::int64_t end_of_text = bpe.id_of("<|endoftext|>");
  std::vector<std::uint32_t> ids;
  if (prompt.empty() && end_of_text >= 0)
    ids.push_back(static_cast<std::uint32_t>(end_of_text));
  else
    ids = bpe.encode(prompt.empty() ? "\n" : prompt);
  std::vector<std::int32_t> tokens;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= c.vocab)
      throw InputError("--prompt: token " + std::to_string(i + 1) + " of its encoding (id " +
                       std::to_string(ids[i]) + ", '" + bpe.bytes_of(ids[i]) +
                       "'): expected an id below the checkpoint's vocabulary of " +
                       std::to_string(c.vocab) + ", found one past it");
    tokens.push_back(static_cast<std::int32_t>(ids[i]));
  }
  return tokens;
}

// One token from `logits` (vocab floats): the largest at temperature 0, else a draw from
// softmax(logits / temperature) over the top_k largest (all when 0).
std::int32_t draw(const float* logits, std::size_t vocab, double temperature, std::size_t top_k,
                  Rng& rng) {
  std::vector<std::pair<float, std::int32_t>> order(vocab);
  for (std::size_t v = 0; v < vocab; ++v) order[v] = {logits[v], static_cast<std::int32_t>(v)};
  // Largest first; ties: the lowest token.
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  if (temperature == 0) return order[0].second;
  const std::size_t k = top_k == 0 ? vocab : std::min(top_k, vocab);
  std::vector<double> p(k);
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i)
    sum += p[i] = std::exp((double(order[i].first) - double(order[0].first)) / temperature);
  double u = static_cast<double>(rng.next_unit()) * sum;
  for (std::size_t i = 0; i < k; ++i) {
    if (u < p[i]) return order[i].second;
    u -= p[i];
  }
  return order[k - 1].second;
}

}  // namespace

CLI::App* add_sample_command(CLI::App& app, SampleOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("sample", "generate text from a language model's checkpoint (gpt:)");
  cmd->add_option("--checkpoint", o.checkpoint, "the checkpoint")->required();
  cmd->add_option("--prompt", o.prompt, "the text to continue (default: a newline)");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "a folder with GPT-2's vocab.json and merges.txt: the prompt is encoded and the "
                  "tokens decoded by its byte-level BPE (a model of token arrays)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--tokens", o.tokens, "tokens to generate")
      ->transform(unsigned_decimal())
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--temperature", o.temperature, "logits / temperature (0: the most likely)")
      ->check(CLI::Validator(
          [](const std::string& text) {  // CLI::Range lets NaN through (no comparison fails)
            double x = 0;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
            return ec == std::errc() && end == text.data() + text.size() && std::isfinite(x)
                       ? std::string()
                       : "expected a finite number, found " + text;
          },
          "FINITE"))
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "draw from the K most likely tokens (0: from all)")
      ->transform(unsigned_decimal())
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "the draws' stream")
      ->transform(unsigned_decimal())
      ->capture_default_str();
  cmd->add_flag("--quiet", o.quiet, "no rate line on stderr");
  return cmd;
}

int sample_command(const SampleOptions& o, std::ostream& out, std::ostream& err) {
  const checkpoint::Checkpoint c = checkpoint::load_checkpoint(o.checkpoint);
  if (!nn::GptModel::is_gpt(c.model))
    throw InputError(o.checkpoint + ": model: expected a language model (gpt:...), found '" +
                     c.model + "'");
  if (c.vocab == 0)
    throw InputError(o.checkpoint + ": section META: expected field vocab (the vocabulary of '" +
                     c.model + "'), found none");
  const nn::GptModel model = nn::GptModel::parse(c.model, static_cast<std::int64_t>(c.vocab));
  if (c.weights.size() != model.layout().total())
    throw InputError(o.checkpoint + ": parameters: expected " +
                     std::to_string(model.layout().total()) + " floats for '" + c.model +
                     "', found " + std::to_string(c.weights.size()));
  std::optional<tokenizer::Bpe> bpe;
  if (!o.tokenizer.empty()) {
    if (!c.characters.empty())
      throw InputError("--tokenizer: expected a checkpoint trained on token arrays, found " +
                       o.checkpoint + ", whose vocabulary is input.txt's " +
                       std::to_string(c.characters.size()) + " characters");
    bpe = tokenizer::Bpe::load(o.tokenizer);
    if (bpe->size() < c.vocab)
      throw InputError("--tokenizer " + o.tokenizer + ": expected a vocabulary of at least " +
                       std::to_string(c.vocab) + " tokens (the checkpoint's), found " +
                       std::to_string(bpe->size()));
  }
  const std::vector<std::int32_t> prompt =
      bpe ? encode_prompt(o.prompt, *bpe, c) : encode_prompt(o.prompt, c);
  auto show = [&](std::int32_t t) {
    if (bpe)
      out << bpe->bytes_of(static_cast<std::uint32_t>(t));
    else if (c.characters.empty())
      out << t << ' ';
    else
      out << data::encode_utf8(c.characters[static_cast<std::size_t>(t)]);
  };
  nn::GptGenerator gen(model, c.weights.data());
  const auto t0 = std::chrono::steady_clock::now();
  const float* logits = nullptr;
  for (const std::int32_t t : prompt) {
    logits = gen.push(t);
    if (!o.prompt.empty()) show(t);
  }
  // The text is the command's product: each token is flushed as it is drawn, and a write that
  // fails (a full disk, a reader gone) ends the command with kExitWriteFailed.
  std::size_t drawn = 0;
  auto written = [&] {
    if (!(out << std::flush))
      throw OutputError(
          "standard output: cannot write the sample (a full disk or a reader gone?) "
          "after " +
          std::to_string(drawn) + " of " + std::to_string(o.tokens) + " tokens");
  };
  written();
  for (std::size_t i = 0; i < o.tokens; ++i) {
    Rng rng({o.seed, 0x5a4dull /* purpose: sampling */, i});
    const std::int32_t t = draw(logits, c.vocab, o.temperature, o.top_k, rng);
    show(t);
    written();
    drawn = i + 1;
    if (i + 1 < o.tokens) logits = gen.push(t);
  }
  out << "\n";
  written();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.quiet)
    err << "cohort sample: " << o.tokens << " tokens in " << std::fixed << std::setprecision(3)
        << seconds << " s (" << std::setprecision(0) << double(o.tokens) / seconds << " tokens/s; "
        << gen.positions_run() << " positions through the model)\n";
  return kExitOk;
}

}  // namespace cohort::cli
