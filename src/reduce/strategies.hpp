// Private: factories of the six strategies (combining_tree.cpp, strategies.cpp).
#pragma once

#include <memory>

#include "cohort/reduce/reducer.hpp"

namespace cohort::reduce::detail {

std::unique_ptr<Reducer> make_combining_tree(const ReducerConfig& config, Executor& executor);
std::unique_ptr<Reducer> make_chunk_owner(const ReducerConfig& config, Executor& executor);
std::unique_ptr<Reducer> make_parameter_server(const ReducerConfig& config, Executor& executor);
std::unique_ptr<Reducer> make_atomic(const ReducerConfig& config, Executor& executor);
std::unique_ptr<Reducer> make_mutex(const ReducerConfig& config, Executor& executor);
std::unique_ptr<Reducer> make_serial(const ReducerConfig& config, Executor& executor);

}  // namespace cohort::reduce::detail
