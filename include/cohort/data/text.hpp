// Text data for character-level language models: a folder with `input.txt` (UTF-8; its
// characters are the tokens) or with token arrays `train_tokens.npy` / `val_tokens.npy`.
//
// input.txt: the vocabulary is the sorted set of distinct characters (Unicode code points); the
// first 90% of the characters train and the last 10% validate (nanoGPT's split: the first
// floor(0.9 n)), unless a `val.txt` is present, which then validates and whose characters must
// all be in input.txt's vocabulary. Token arrays: one-dimensional arrays of unsigned integers
// (numpy.save), the vocabulary size the largest token of both + 1. Every split must hold at
// least one window of `block` + 1 tokens.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"
#include "cohort/data/npy.hpp"
#include "cohort/data/tokens.hpp"

namespace cohort::data {

// The largest vocabulary a token array may imply (its embedding table is sized by it).
inline constexpr std::uint32_t kMaxVocab = std::uint32_t{1} << 20;

struct TextData {
  // The characters of the vocabulary in token order (code points), when it came from text;
  // empty for token arrays, whose vocabulary is 0 .. vocab_size - 1.
  std::vector<std::uint32_t> characters;
  std::size_t vocab_size = 0;
  Tokens train, val;                     // token ids, each < vocab_size
  std::string train_source, val_source;  // the files (and range) the splits came from
};

// The code points of `bytes` (strict UTF-8: no overlong forms, surrogates or values past
// U+10FFFF; a byte-order mark at the start is not skipped: it is a character). Throws InputError
// "name: byte B: expected ..., found ..." at the first invalid sequence, or for an empty text.
std::vector<std::uint32_t> decode_utf8(std::span<const std::uint8_t> bytes,
                                       const std::string& name);

// The UTF-8 encoding of one code point.
std::string encode_utf8(std::uint32_t code_point);

// Text splits from the bytes of input.txt (and of val.txt, when `val` is given); the fuzzer
// drives this. Throws InputError naming the file and position.
TextData read_text(std::span<const std::uint8_t> input, const std::string& input_name,
                   const std::span<const std::uint8_t>* val, const std::string& val_name,
                   std::size_t block);

// The tokens of a one-dimensional array of unsigned integers of 1, 2 or 4 bytes.
std::vector<std::uint32_t> tokens_of_array(const ArrayView& a);

// Token arrays for a language model of `block`: every token below kMaxVocab, the vocabulary the
// largest + 1, a window in each split.
TextData token_arrays(const ArrayView& train, const ArrayView& val, std::size_t block);

// The tokens an llm.c shard's bytes hold: checks its header (256 little-endian int32: magic
// 20240520, version 1, the token count) and that the uint16 tokens after it are exactly the rest.
// Throws InputError naming `name` and the field.
std::size_t shard_tokens(std::span<const std::uint8_t> bytes, const std::string& name);
inline constexpr std::size_t kShardHeaderBytes = 1024;

// Token arrays from the bytes of train_tokens.npy and val_tokens.npy.
TextData read_token_arrays(std::span<const std::uint8_t> train, const std::string& train_name,
                           std::span<const std::uint8_t> val, const std::string& val_name,
                           std::size_t block);

// The files a text folder may hold, besides llm.c's shards (is_shard).
inline constexpr const char* kTextFiles[] = {"input.txt", "val.txt", "train_tokens.npy",
                                             "val_tokens.npy"};

// Whether `name` is an llm.c token shard's: "*_train_*.bin" (`split` "train") or "*_val_*.bin".
bool is_shard(const std::string& name, const std::string& split);

// Whether `dir` holds text data (input.txt, the token arrays or llm.c's shards).
bool is_text_folder(const std::filesystem::path& dir);

// input.txt (+ val.txt), the two token arrays, or llm.c's shards (each split's in name order, one
// sequence) in `dir`; files of two kinds are refused. Token arrays and shards are mapped, never
// read whole: their tokens are checked against the vocabulary in one pass that leaves none of
// them resident, and a shard must hold a window of `block` + 1 tokens.
TextData load_text_folder(const std::filesystem::path& dir, std::size_t block);

// The splits a language model of `block` trains and validates on (Dataset::text): training
// windows at every offset, validation windows side by side (the split's whole length in
// floor((n - 1) / block) windows: deterministic, as nanoGPT's estimate is not); the characters,
// the vocabulary (the class count of both). `text` must hold a window per split (as the readers
// check).
Splits text_splits(TextData text, std::size_t block);

}  // namespace cohort::data
