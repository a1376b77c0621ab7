// Names of enum values, kept in one table next to each enum: the table gives to_string, parse
// (with an error that lists every accepted name) and the list that help texts and the job-config
// schema show. Not a reflection facility: each enum writes its own table once.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort {

template <class E>
struct Named {
  E value;
  std::string_view name;
};

// The name of `value` in `table` ("?" if the table misses it, which a test of each table rules
// out).
template <class E>
constexpr std::string_view name_of(std::span<const Named<E>> table, E value) {
  for (const Named<E>& n : table)
    if (n.value == value) return n.name;
  return "?";
}

// "a, b or c": the accepted names, for messages and help texts.
template <class E>
std::string names_text(std::span<const Named<E>> table) {
  std::string text;
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (i > 0) text += i + 1 == table.size() ? " or " : ", ";
    text += table[i].name;
  }
  return text;
}

template <class E>
std::vector<std::string> names_list(std::span<const Named<E>> table) {
  std::vector<std::string> names;
  for (const Named<E>& n : table) names.emplace_back(n.name);
  return names;
}

// The value named `text`; throws InputError "<what>: expected a, b or c, found '<text>'".
template <class E>
E parse_name(std::span<const Named<E>> table, std::string_view text, const std::string& what) {
  for (const Named<E>& n : table)
    if (n.name == text) return n.value;
  throw InputError(what + ": expected " + names_text(table) + ", found '" + std::string(text) +
                   "'");
}

// The same on a table as declared (`kStrategyNames`), so callers need not spell the span.
template <class E, std::size_t K>
constexpr std::string_view name_of(const Named<E> (&table)[K], E value) {
  return name_of(std::span<const Named<E>>(table), value);
}
template <class E, std::size_t K>
std::string names_text(const Named<E> (&table)[K]) {
  return names_text(std::span<const Named<E>>(table));
}
template <class E, std::size_t K>
std::vector<std::string> names_list(const Named<E> (&table)[K]) {
  return names_list(std::span<const Named<E>>(table));
}
template <class E, std::size_t K>
E parse_name(const Named<E> (&table)[K], std::string_view text, const std::string& what) {
  return parse_name(std::span<const Named<E>>(table), text, what);
}

}  // namespace cohort
