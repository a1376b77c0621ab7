// --init-from: weights from a safetensors file. What `cohort export` writes reads back to the
// checkpoint's weights (`cohort eval --init-from` gives `cohort eval --checkpoint`'s digest), for
// a layer list with bn (its running statistics) and a language model, the latter also in Hugging
// Face's GPT-2 layout (names without "transformer.", Conv1D weights (in, out), attn.bias buffers,
// no lm_head), and as its folder (export --layout hf: config.json gives the model), and as llm.c's
// checkpoint (its header gives the model); GPT-2's architecture through each; a run from such
// weights gives one digest for 1 and 2 workers and through a resume; each damaged file is exit 2
// naming the tensor or the header's field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "testing.hpp"

namespace cohort::cli {
namespace init_from_test {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using testing::cohort;
using testing::Result;

// A safetensors file as its header and its tensors' bytes, in header order.
struct File {
  ordered_json header;
  std::vector<std::pair<std::string, std::string>> tensors;  // name, bytes
};

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

File parse(const fs::path& p) {
  const std::string bytes = read(p);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  File f;
  f.header = ordered_json::parse(bytes.substr(8, n));
  for (const auto& [name, t] : f.header.items()) {
    if (name == "__metadata__") continue;
    const auto begin = t["data_offsets"][0].get<std::size_t>(),
               end = t["data_offsets"][1].get<std::size_t>();
    f.tensors.emplace_back(name, bytes.substr(8 + n + begin, end - begin));
  }
  return f;
}

void write(const fs::path& p, const File& f) {
  ordered_json header = ordered_json::object();
  std::string data;
  for (const auto& [name, bytes] : f.tensors) {
    ordered_json t = f.header.contains(name) ? f.header[name] : ordered_json::object();
    t["data_offsets"] = {data.size(), data.size() + bytes.size()};
    header[name] = t;
    data += bytes;
  }
  const std::string text = header.dump();
  std::string out(8, '\0');
  const std::uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::ofstream(p, std::ios::binary) << out << text << data;
}

// A (rows, cols) float32 matrix's bytes transposed to (cols, rows).
std::string transposed(const std::string& bytes, std::size_t rows, std::size_t cols) {
  std::string out(bytes.size(), '\0');
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      std::memcpy(out.data() + 4 * (c * rows + r), bytes.data() + 4 * (r * cols + c), 4);
  return out;
}

// nanoGPT's names (what cohort export writes) as Hugging Face's GPT-2 stores them.
File hugging_face(const File& nano) {
  File hf;
  for (const auto& [name, bytes] : nano.tensors) {
    if (name == "lm_head.weight") continue;  // tied: not stored
    std::string renamed = name.substr(std::string("transformer.").size());
    ordered_json t = nano.header[name];
    std::string b = bytes;
    const bool conv1d = name.ends_with("c_attn.weight") || name.ends_with("c_proj.weight") ||
                        name.ends_with("c_fc.weight");
    if (conv1d) {
      const auto rows = t["shape"][0].get<std::size_t>(), cols = t["shape"][1].get<std::size_t>();
      b = transposed(bytes, rows, cols);
      t["shape"] = {cols, rows};
    }
    hf.header[renamed] = t;
    hf.tensors.emplace_back(renamed, b);
    if (name.ends_with("ln_1.weight")) {  // the causal mask buffer HF stores beside each block
      const std::string block = renamed.substr(0, renamed.find(".ln_1"));
      hf.header[block + ".attn.bias"] = {{"dtype", "F32"}, {"shape", {1}}};
      hf.tensors.emplace_back(block + ".attn.bias", std::string(4, '\0'));
    }
  }
  return hf;
}

class InitFrom : public testing::TempDirTest {
 protected:
  // Trains `args` for a few steps, saves, exports: the checkpoint and its safetensors file.
  void trained(const std::vector<std::string>& args) {
    ck_ = (dir_ / "run.ckpt").string();
    st_ = (dir_ / "run.safetensors").string();
    std::vector<std::string> a{"train", "--steps", "3", "--quiet", "--save", ck_};
    a.insert(a.end(), args.begin(), args.end());
    Result r = cohort(a);
    ASSERT_EQ(r.code, 0) << r.err;
    r = cohort({"export", "--checkpoint", ck_, "--format", "safetensors", "-o", st_, "--quiet"});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  std::string digest(std::vector<std::string> eval) {
    const std::string summary = (dir_ / "eval.json").string();
    eval.insert(eval.begin(), "eval");
    eval.insert(eval.end(), {"--summary", summary, "--quiet"});
    const Result r = cohort(eval);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? nlohmann::json::parse(read(summary))["weights_digest"].get<std::string>()
                       : "";
  }
  std::string ck_, st_;
};

TEST_F(InitFrom, ALayerListWithBnReadsBackItsExport) {
  const std::string model = "conv(4,3)-bn-relu-maxpool(2)-flatten-linear(10)";
  trained({"--data", COHORT_FIXTURE_DIR, "--model", model, "--batch", "32"});
  const std::string want = digest({"--checkpoint", ck_, "--data", COHORT_FIXTURE_DIR});
  EXPECT_EQ(digest({"--init-from", st_, "--model", model, "--data", COHORT_FIXTURE_DIR}), want);
}

class InitFromGpt : public InitFrom {
 protected:
  void SetUp() override {
    InitFrom::SetUp();
    text_ = (dir_ / "text").string();
    fs::create_directories(text_);
    std::ifstream in(std::string(COHORT_FIXTURE_DIR) + "/../tinyshakespeare/input.txt");
    std::string t(3000, '\0');
    in.read(t.data(), static_cast<std::streamsize>(t.size()));
    std::ofstream(fs::path(text_) / "input.txt") << t;
    trained({"--data", text_, "--model", kModel, "--batch", "4"});
  }
  static constexpr const char* kModel = "gpt:2-2-16-8";
  std::string text_;
};

TEST_F(InitFromGpt, NanoGptsNamesAndHuggingFacesLayoutGiveTheCheckpointsWeights) {
  const std::string want = digest({"--checkpoint", ck_, "--data", text_});
  EXPECT_EQ(digest({"--init-from", st_, "--model", kModel, "--data", text_}), want);
  const fs::path hf = dir_ / "hf.safetensors";
  write(hf, hugging_face(parse(st_)));
  EXPECT_EQ(digest({"--init-from", hf.string(), "--model", kModel, "--data", text_}), want);
}

// export --layout hf writes Hugging Face's folder; --init-from takes the folder, its config.json
// giving the model, and refuses what cohort's model cannot be.
TEST_F(InitFromGpt, AHuggingFaceFolderGivesTheModelAndTheWeights) {
  const std::string want = digest({"--checkpoint", ck_, "--data", text_});
  const fs::path folder = dir_ / "hf";
  Result r = cohort({"export", "--checkpoint", ck_, "--format", "safetensors", "--layout", "hf",
                     "-o", folder.string(), "--quiet"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto config = nlohmann::json::parse(read(folder / "config.json"));
  EXPECT_EQ(config["n_layer"], 2);
  EXPECT_EQ(config["n_head"], 2);
  EXPECT_EQ(config["n_embd"], 16);
  EXPECT_EQ(config["n_positions"], 8);
  EXPECT_EQ(config["activation_function"], "gelu");
  EXPECT_EQ(config["bias"], false);
  // Hugging Face's names and Conv1D shapes.
  const File hf = parse(folder / "model.safetensors");
  EXPECT_EQ(hf.header["h.0.attn.c_attn.weight"]["shape"], nlohmann::json({16, 48}));
  EXPECT_FALSE(hf.header.contains("lm_head.weight"));
  EXPECT_EQ(digest({"--init-from", folder.string(), "--data", text_}), want);  // no --model
  r = cohort(
      {"train", "--data", text_, "--init-from", folder.string(), "--batch", "4", "--dry-run"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("gpt:2-2-16-8"), std::string::npos) << r.out;
  r = cohort({"train", "--data", text_, "--init-from", folder.string(), "--model", "gpt:2-2-16-4",
              "--dry-run"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(
      r.err.find("--model: expected 'gpt:2-2-16-8' (" + folder.string() +
                 "/config.json's model; a dropout and pad= may be added), found 'gpt:2-2-16-4'"),
      std::string::npos)
      << r.err;
  // A dropout and the vocabulary's padding are the run's own.
  r = cohort({"train", "--data", text_, "--init-from", folder.string(), "--model",
              "gpt:2-2-16-8-0.1,pad=64", "--batch", "4", "--dry-run"});
  EXPECT_EQ(r.code, 0) << r.err;
  r = cohort({"train", "--data", text_, "--init-from", folder.string(), "--model",
              "gpt:2-2-16-8,bias", "--dry-run"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("found 'gpt:2-2-16-8,bias'"), std::string::npos) << r.err;
  // GPT-2's own config (the tanh GELU; biases, as it has no "bias": false) over weights without
  // biases: the first missing tensor named.
  std::ofstream(folder / "config.json")
      << R"({"n_layer": 2, "n_head": 2, "n_embd": 16, "n_positions": 8, "vocab_size": 52,
             "activation_function": "gelu_new"})";
  r = cohort({"eval", "--init-from", folder.string(), "--data", text_});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("model.safetensors: tensor 'transformer.h.0.ln_1.bias': expected shape "
                       "[16] (a tensor of --model 'gpt:2-2-16-8,bias,gelu=tanh'), found none"),
            std::string::npos)
      << r.err;
  std::ofstream(folder / "config.json")
      << R"({"n_layer": 2, "n_head": 2, "n_embd": 16, "n_positions": 8, "vocab_size": 52,
             "activation_function": "relu"})";
  r = cohort({"eval", "--init-from", folder.string(), "--data", text_});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("config.json: activation_function: expected \"gelu\" (the exact GELU) or "
                       "\"gelu_new\" (GPT-2's tanh form), found \"relu\""),
            std::string::npos)
      << r.err;
  std::ofstream(folder / "config.json")
      << R"({"n_layer": 2, "n_head": 2, "n_embd": 16, "n_positions": 8, "vocab_size": 60,
             "activation_function": "gelu", "bias": false})";
  r = cohort({"eval", "--init-from", folder.string(), "--data", text_});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("vocabulary (config.json's vocab_size, llm.c's V) is 60, the data's "
                       "vocabulary (--data) 52"),
            std::string::npos)
      << r.err;
}

// GPT-2's architecture (biases, the tanh GELU, 52 tokens padded to 64): both layouts write its
// biases and its 52 token rows (not the padding), config.json says "gelu_new" and bias true, and
// each reads back to the checkpoint's weights: the file with --model, the folder with a --model
// that adds the padding back (config.json does not say it).
TEST_F(InitFromGpt, Gpt2sArchitectureReadsBackThroughBothLayouts) {
  const std::string model = "gpt:2-2-16-8,bias,gelu=tanh,pad=64";
  trained({"--data", text_, "--model", model, "--batch", "4"});
  const std::string want = digest({"--checkpoint", ck_, "--data", text_});
  const File nano = parse(st_);
  EXPECT_EQ(nano.header["transformer.wte.weight"]["shape"], ordered_json({52, 16}));
  EXPECT_EQ(nano.header["transformer.h.1.mlp.c_fc.bias"]["shape"], ordered_json({64}));
  EXPECT_EQ(nano.header["transformer.ln_f.bias"]["shape"], ordered_json({16}));
  EXPECT_EQ(digest({"--init-from", st_, "--model", model, "--data", text_}), want);
  const fs::path folder = dir_ / "hf2";
  const Result r = cohort({"export", "--checkpoint", ck_, "--format", "safetensors", "--layout",
                           "hf", "-o", folder.string(), "--quiet"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto config = nlohmann::json::parse(read(folder / "config.json"));
  EXPECT_EQ(config["activation_function"], "gelu_new");
  EXPECT_EQ(config["bias"], true);
  EXPECT_EQ(config["vocab_size"], 52);
  const File hf = parse(folder / "model.safetensors");
  EXPECT_EQ(hf.header["h.0.attn.c_attn.bias"]["shape"], ordered_json({48}));
  EXPECT_EQ(hf.header["wte.weight"]["shape"], ordered_json({52, 16}));
  EXPECT_EQ(digest({"--init-from", folder.string(), "--model", model, "--data", text_}), want);
}

// nanoGPT's tensors (an export of gpt:L-H-C-T,bias,gelu=tanh) as llm.c's checkpoint: its header
// (magic, version 3, maxT, V, L, NH, C, Vp) and float32 tensors in its order, wte padded to Vp
// rows with zeros.
std::string llmc_checkpoint(const File& nano, std::int32_t L, std::int32_t NH, std::int32_t C,
                            std::int32_t max_t, std::int32_t V, std::int32_t Vp) {
  std::map<std::string, std::string> t(nano.tensors.begin(), nano.tensors.end());
  std::vector<std::int32_t> header(256, 0);
  const std::int32_t fields[] = {20240326, 3, max_t, V, L, NH, C, Vp};
  std::copy(std::begin(fields), std::end(fields), header.begin());
  std::string out(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  out += t.at("transformer.wte.weight") + std::string(std::size_t(Vp - V) * C * 4, '\0');
  out += t.at("transformer.wpe.weight");
  for (const char* part :
       {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias"})
    for (std::int32_t l = 0; l < L; ++l)
      out += t.at("transformer.h." + std::to_string(l) + "." + part);
  return out + t.at("transformer.ln_f.weight") + t.at("transformer.ln_f.bias");
}

// llm.c's checkpoint: with --model it gives the checkpoint's weights; without, its header gives
// the model (its padding 128 to 128 rows: pad=128); a --model without its architecture, another
// version, a truncated file and another vocabulary are exit 2 naming them.
TEST_F(InitFromGpt, LlmcsCheckpointGivesTheModelAndTheWeights) {
  const std::string model = "gpt:2-2-16-8,bias,gelu=tanh,pad=64";
  trained({"--data", text_, "--model", model, "--batch", "4"});
  const std::string want = digest({"--checkpoint", ck_, "--data", text_});
  const std::string bytes = llmc_checkpoint(parse(st_), 2, 2, 16, 8, 52, 128);
  const fs::path bin = dir_ / "gpt2.bin";
  std::ofstream(bin, std::ios::binary) << bytes;
  EXPECT_EQ(digest({"--init-from", bin.string(), "--model", model, "--data", text_}), want);
  Result r =
      cohort({"train", "--data", text_, "--init-from", bin.string(), "--batch", "4", "--dry-run"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("gpt:2-2-16-8,bias,gelu=tanh,pad=128"), std::string::npos) << r.out;
  r = cohort({"train", "--data", text_, "--init-from", bin.string(), "--model", "gpt:2-2-16-8",
              "--dry-run"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--model: expected 'gpt:2-2-16-8,bias,gelu=tanh,pad=128' (" + bin.string() +
                       "'s header's model"),
            std::string::npos)
      << r.err;
  std::string damaged = bytes;
  damaged[4] = 5;  // version 5
  std::ofstream(bin, std::ios::binary) << damaged;
  r = cohort({"eval", "--init-from", bin.string(), "--model", model, "--data", text_});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(
      r.err.find(bin.string() + ": header[1] (version): expected 3 (float32 weights), found 5"),
      std::string::npos)
      << r.err;
  std::ofstream(bin, std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  r = cohort({"eval", "--init-from", bin.string(), "--model", model, "--data", text_});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(bin.string() + ": expected " + std::to_string(bytes.size()) +
                       " bytes (the header's model in float32), found " +
                       std::to_string(bytes.size() - 4) + " bytes"),
            std::string::npos)
      << r.err;
  std::ofstream(bin, std::ios::binary) << llmc_checkpoint(parse(st_), 2, 2, 16, 8, 52, 128)
                                              .replace(12, 4, std::string("\x3c\0\0\0", 4));
  r = cohort({"eval", "--init-from", bin.string(), "--data", text_});  // V 60
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("llm.c's V) is 60, the data's vocabulary (--data) 52"), std::string::npos)
      << r.err;
}

TEST_F(InitFromGpt, ARunFromTheWeightsIsOneForAnyWorkersAndThroughAResume) {
  auto run = [&](std::vector<std::string> extra) {
    const std::string summary = (dir_ / "s.json").string();
    std::vector<std::string> a{"train",   "--data",  text_,         "--model", kModel,
                               "--batch", "4",       "--init-from", st_,       "--steps",
                               "4",       "--quiet", "--summary",   summary};
    a.insert(a.end(), extra.begin(), extra.end());
    const Result r = cohort(a);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? nlohmann::json::parse(read(summary))["weights_digest"].get<std::string>()
                       : "";
  };
  const std::string one = run({"--workers", "1"});
  EXPECT_EQ(run({"--workers", "2"}), one);
  const std::string half = (dir_ / "half.ckpt").string();
  run({"--steps", "2", "--save", half});
  EXPECT_EQ(run({"--resume", half}), one);
  // Not the seed's initialisation: without --init-from the weights differ.
  const std::string summary = (dir_ / "plain.json").string();
  ASSERT_EQ(cohort({"train", "--data", text_, "--model", kModel, "--batch", "4", "--steps", "4",
                    "--quiet", "--summary", summary})
                .code,
            0);
  EXPECT_NE(nlohmann::json::parse(read(summary))["weights_digest"].get<std::string>(), one);
}

TEST_F(InitFromGpt, ADamagedFileIsRefusedNamingTheTensor) {
  const File good = parse(st_);
  auto refusal = [&](const File& f, const std::string& model = kModel) {
    const fs::path p = dir_ / "bad.safetensors";
    write(p, f);
    const Result r = cohort({"train", "--data", text_, "--model", model, "--batch", "4",
                             "--init-from", p.string(), "--dry-run"});
    EXPECT_EQ(r.code, 2) << r.err;
    return r.err;
  };
  File missing = good;
  missing.tensors.erase(missing.tensors.begin() + 2);  // transformer.h.0.ln_1.weight
  EXPECT_NE(refusal(missing).find("tensor 'transformer.h.0.ln_1.weight': expected shape [16]"),
            std::string::npos)
      << refusal(missing);
  File extra = good;
  extra.header["transformer.h.0.attn.c_attn.bias"] = {{"dtype", "F32"}, {"shape", {48}}};
  extra.tensors.emplace_back("transformer.h.0.attn.c_attn.bias", std::string(48 * 4, '\0'));
  EXPECT_NE(refusal(extra).find("tensor 'transformer.h.0.attn.c_attn.bias': expected only "
                                "tensors of --model 'gpt:2-2-16-8'"),
            std::string::npos)
      << refusal(extra);
  const std::string wider = refusal(good, "gpt:2-2-32-8");  // the vocabulary: 52 characters
  EXPECT_NE(wider.find("tensor 'transformer.wte.weight': expected shape [52, 32] for --model "
                       "'gpt:2-2-32-8', found [52, 16]"),
            std::string::npos)
      << wider;
  File untied = good;
  untied.tensors.back().second[0] ^= 1;  // lm_head.weight, last
  EXPECT_NE(refusal(untied).find("tensor 'lm_head.weight': expected the values of "
                                 "transformer.wte.weight"),
            std::string::npos)
      << refusal(untied);
  File nan = good;
  const float not_a_number = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan.tensors[0].second.data() + 4, &not_a_number, 4);
  EXPECT_NE(refusal(nan).find("tensor 'transformer.wte.weight': element 1: expected a finite"),
            std::string::npos)
      << refusal(nan);
  // eval: --init-from needs the model it is for.
  const Result r = cohort({"eval", "--init-from", st_, "--data", text_});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--init-from: expected --model SPEC as well"), std::string::npos) << r.err;
}

}  // namespace init_from_test
}  // namespace cohort::cli
