// llm.c's GPT-2 checkpoints (`gpt2_124M.bin`, written by its train_gpt2.py) for --init-from:
// export.hpp's is_llmc_checkpoint, read_llmc_model and, through read_weights, read_llmc_weights.
//
// The file: a header of 256 little-endian int32 (magic 20240326, version 3 for float32 weights,
// maxT, V, L, NH, C, Vp), then float32 tensors in llm.c's order (fill_in_parameter_sizes): wte
// (Vp, C), wpe (maxT, C), then each per-layer tensor for all L layers at once — ln1w, ln1b (L,
// C), qkvw (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w, ln2b (L, C), fcw
// (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C) — then lnfw, lnfb (C). Weights are
// (out, in), as nn.Linear's and cohort's. GPT-2's architecture: biases, the tanh GELU; wte's
// rows past V are padding, not read.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/export/export.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/model.hpp"

namespace cohort::exporting {

namespace {

constexpr std::int32_t kMagic = 20240326;
constexpr std::int32_t kFloat32 = 3;
constexpr std::size_t kHeaderInts = 256;

[[noreturn]] void refuse_file(const std::string& where, const std::string& expected,
                              const std::string& found) {
  throw InputError(where + ": expected " + expected + ", found " + found);
}

struct Header {
  std::int64_t max_t, vocab, layers, heads, embd, padded;
};

// The header's fields, each checked (the file's size against them by the caller).
Header parse_header(const std::vector<std::uint8_t>& file, const std::string& name) {
  if (file.size() < kHeaderInts * 4)
    refuse_file(name, "llm.c's header of " + std::to_string(kHeaderInts * 4) + " bytes",
                std::to_string(file.size()) + " bytes");
  std::int32_t h[8];
  std::memcpy(h, file.data(), sizeof h);
  if (h[0] != kMagic)
    refuse_file(name + ": header[0]", "llm.c's magic 20240326", std::to_string(h[0]));
  if (h[1] != kFloat32)
    refuse_file(name + ": header[1] (version)", "3 (float32 weights)", std::to_string(h[1]));
  const char* fields[] = {"maxT", "V", "L", "NH", "C", "Vp"};
  for (int i = 2; i < 8; ++i)
    if (h[i] < 1 || h[i] > (1 << 20))
      refuse_file(name + ": header[" + std::to_string(i) + "] (" + fields[i - 2] + ")",
                  "an integer from 1 to 1048576", std::to_string(h[i]));
  const Header r{h[2], h[3], h[4], h[5], h[6], h[7]};
  if (r.embd % r.heads != 0)
    refuse_file(name + ": header[5] (NH)", "a divisor of C " + std::to_string(r.embd),
                std::to_string(r.heads));
  if (r.padded < r.vocab)
    refuse_file(name + ": header[7] (Vp)", "at least V " + std::to_string(r.vocab),
                std::to_string(r.padded));
  return r;
}

// The file's first `n` bytes (fewer where it is shorter).
std::vector<std::uint8_t> read_prefix(const std::filesystem::path& path, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string() + ": expected a readable file, found none");
  std::vector<std::uint8_t> out(n);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n));
  out.resize(static_cast<std::size_t>(in.gcount()));
  return out;
}

}  // namespace

bool is_llmc_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  const std::vector<std::uint8_t> head = read_prefix(path, 4);
  std::int32_t magic = 0;
  if (head.size() == 4) std::memcpy(&magic, head.data(), 4);
  return magic == kMagic;
}

FolderModel read_llmc_model(const std::filesystem::path& path) {
  const std::string name = path.string();
  const Header h = parse_header(read_prefix(path, kHeaderInts * 4), name);
  FolderModel m;
  m.spec = "gpt:" + std::to_string(h.layers) + "-" + std::to_string(h.heads) + "-" +
           std::to_string(h.embd) + "-" + std::to_string(h.max_t) + ",bias,gelu=tanh";
  for (const std::int64_t multiple : {128, 64})  // llm.c pads to 128 (50,257 to 50,304)
    if (h.padded > h.vocab && (h.vocab + multiple - 1) / multiple * multiple == h.padded) {
      m.spec += ",pad=" + std::to_string(multiple);
      break;
    }
  m.vocab = h.vocab;
  m.source = name + "'s header";
  return m;
}

InitialWeights read_llmc_weights(const std::vector<std::uint8_t>& file, const std::string& name,
                                 const nn::Model& model) {
  const Header h = parse_header(file, name);
  if (model.kind().window() == 0)
    refuse_file("--model '" + model.spec() + "'", "a language model for llm.c's " + name,
                "a classifier");
  const nn::GptModel& gpt = nn::gpt_model(model);
  const nn::GptShape& s = gpt.shape();
  const std::string model_is = " (" + name + "'s header), found '" + model.spec() + "'";
  if (s.layers != h.layers || s.heads != h.heads || s.embd != h.embd || s.block != h.max_t)
    throw InputError("--model: expected LAYERS-HEADS-EMBD-BLOCK " + std::to_string(h.layers) + "-" +
                     std::to_string(h.heads) + "-" + std::to_string(h.embd) + "-" +
                     std::to_string(h.max_t) + model_is);
  if (!s.bias || !s.tanh_gelu)
    throw InputError("--model: expected GPT-2's architecture, ,bias,gelu=tanh" + model_is);
  if (s.vocab != h.vocab)
    refuse_file(name + ": header[3] (V)",
                std::to_string(s.vocab) + " tokens (the model's vocabulary)",
                std::to_string(h.vocab));
  const std::int64_t L = h.layers, C = h.embd;
  // The tensors in llm.c's order: (count of floats a layer, or in all, and where each goes).
  struct Part {
    const char* name;
    std::int64_t floats;  // per layer where per_layer
    bool per_layer;
    std::size_t nn::GptModel::BlockOffsets::*offset;  // per layer
  };
  using B = nn::GptModel::BlockOffsets;
  const Part parts[] = {{"ln1w", C, true, &B::ln_1},
                        {"ln1b", C, true, &B::ln_1_bias},
                        {"qkvw", 3 * C * C, true, &B::c_attn},
                        {"qkvb", 3 * C, true, &B::c_attn_bias},
                        {"attprojw", C * C, true, &B::attn_proj},
                        {"attprojb", C, true, &B::attn_proj_bias},
                        {"ln2w", C, true, &B::ln_2},
                        {"ln2b", C, true, &B::ln_2_bias},
                        {"fcw", 4 * C * C, true, &B::c_fc},
                        {"fcb", 4 * C, true, &B::c_fc_bias},
                        {"fcprojw", 4 * C * C, true, &B::mlp_proj},
                        {"fcprojb", C, true, &B::mlp_proj_bias}};
  std::uint64_t total = static_cast<std::uint64_t>((h.padded + h.max_t) * C + 2 * C);
  for (const Part& p : parts) total += static_cast<std::uint64_t>(p.floats * L);
  const std::uint64_t want = kHeaderInts * 4 + total * 4;
  if (file.size() != want)
    refuse_file(name, std::to_string(want) + " bytes (the header's model in float32)",
                std::to_string(file.size()) + " bytes");
  InitialWeights w;
  w.params.assign(model.layout().total(), 0.0f);
  w.stats.assign(model.stats_layout().total(), 0.0f);
  std::size_t at = kHeaderInts * 4;  // the next tensor's first byte
  // `count` floats of the tensor `what` into params + to (each finite), then past `skip` more.
  auto take = [&](const std::string& what, std::size_t to, std::int64_t count, std::int64_t skip) {
    float* out = w.params.data() + to;
    std::memcpy(out, file.data() + at, static_cast<std::size_t>(count) * 4);
    for (std::int64_t i = 0; i < count; ++i)
      if (!std::isfinite(out[i]))
        refuse_file(name + ": " + what + " element " + std::to_string(i), "a finite value",
                    std::isnan(out[i]) ? "NaN" : "infinity");
    at += static_cast<std::size_t>(count + skip) * 4;
  };
  take("wte", gpt.wte(), h.vocab * C, (h.padded - h.vocab) * C);
  take("wpe", gpt.wpe(), h.max_t * C, 0);
  for (const Part& p : parts)
    for (std::int64_t l = 0; l < L; ++l)
      take(std::string(p.name) + "[" + std::to_string(l) + "]", gpt.block(l).*p.offset, p.floats,
           0);
  take("lnfw", gpt.ln_f(), C, 0);
  take("lnfb", gpt.ln_f_bias(), C, 0);
  return w;
}

}  // namespace cohort::exporting
