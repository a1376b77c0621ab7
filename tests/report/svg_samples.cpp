// Writes one SVG per awkward input (several runs, a label full of XML's special characters, one
// point, a constant loss, only step lines, only epoch lines, no series at all) into the folder
// given as the only argument, for check_svg.py to parse as XML. Not a test by itself.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cohort/report/plot.hpp"

namespace {

using cohort::report::EpochPoint;
using cohort::report::Series;
using cohort::report::StepPoint;

Series run(const std::string& label, double scale) {
  Series s{label, {}, {}};
  for (std::uint64_t step = 10; step <= 200; step += 10)
    s.steps.push_back({step, scale * 2.3 / (1.0 + 0.05 * double(step))});
  for (std::uint64_t epoch = 1; epoch <= 4; ++epoch)
    s.epochs.push_back({epoch, 50 * epoch, scale / double(epoch), scale * 1.1 / double(epoch),
                        0.6 + 0.08 * double(epoch)});
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: svg_samples FOLDER\n";
    return 2;
  }
  const std::filesystem::path folder = argv[1];
  Series steps_only = run("steps only", 1), epochs_only = run("epochs only", 1);
  steps_only.epochs.clear();
  epochs_only.steps.clear();
  const Series one{"one point", {{7, 0.5}}, {{1, 7, 0.5, 0.5, 0.5}}};
  const Series constant{"constant", {{1, 0.25}, {2, 0.25}, {3, 0.25}}, {}};
  const std::pair<const char*, std::vector<Series>> samples[] = {
      {"several_runs.svg", {run("lr 0.1", 1), run("lr <0.05> & \"nesterov\" 'on'", 0.8)}},
      {"one_point.svg", {one}},
      {"constant.svg", {constant}},
      {"steps_only.svg", {steps_only}},
      {"epochs_only.svg", {epochs_only}},
      {"no_series.svg", {}},
  };
  for (const auto& [name, series] : samples) {
    std::ofstream out(folder / name);
    out << cohort::report::render_svg(series, {.title = std::string("sample: ") + name});
    if (!out) {
      std::cerr << (folder / name).string() << ": cannot write\n";
      return 1;
    }
  }
  return 0;
}
