// Training curves: reads the JSON Lines files `cohort train --metrics` writes and draws them as
// one self-contained SVG (no scripts, no external fonts) with two panels side by side: loss
// against training step, test accuracy against epoch. Several files are several runs to compare.
// Not a plotting library: the layout, scales and colours are fixed; the caller picks the size.
//
// Needs neither oneDNN nor oneTBB, so it is built in every configuration.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace cohort::report {

// A "step" line: the mean training loss over the log interval that ends at `step`.
struct StepPoint {
  std::uint64_t step = 0;  // training steps (batches) done
  double loss = 0;         // finite
};

// An "epoch" line: the results after the epoch that ends at `step`.
struct EpochPoint {
  std::uint64_t epoch = 0;   // 1-based
  std::uint64_t step = 0;    // training steps (batches) done when the epoch ended
  double train_loss = 0;     // finite
  double test_loss = 0;      // finite
  double test_accuracy = 0;  // in [0, 1]
};

// One run. `steps` is in strictly increasing step order; `epochs` in strictly increasing epoch
// and step order. Either may be empty, not both (read_metrics guarantees it).
struct Series {
  std::string label;  // the legend's name for the run; read_metrics uses the file name
  std::vector<StepPoint> steps;
  std::vector<EpochPoint> epochs;
};

// Reads one metrics file. Lines whose "kind" is neither "step" nor "epoch" are skipped (kinds
// added later), as are blank lines; fields the plot does not use are ignored. Throws InputError
// naming file:line, the field, what was expected and what was found, for: a missing or
// unreadable file, a line that is not a JSON object, a missing or wrongly typed "kind", a
// missing, wrongly typed or out-of-range field (step and epoch: non-negative integers, epoch
// >= 1; losses: finite numbers; test_accuracy: in [0, 1]), steps (or epochs) that do not
// strictly increase from one line of a kind to the next, and a file with no step and no epoch
// line.
Series read_metrics(const std::filesystem::path& path);

struct PlotOptions {
  int width = 1000;        // the whole image in pixels; each panel takes half (>= 600)
  int panel_height = 380;  // each panel in pixels (>= 200); title and legend add to the image
  std::string title{};     // drawn above the panels unless empty
};

// Draws `series` as one SVG document (UTF-8 text). Each series has its own colour (ten colours,
// then they repeat). Loss panel: a polyline of the step losses, a filled circle per epoch's train
// loss and a hollow square per epoch's test loss, at the epoch's step. Accuracy panel: a polyline
// with a circle per epoch. A panel with nothing to draw says so ("no epoch results"). A legend
// under the panels names each series by its label (XML-escaped). Throws InputError for options
// below the minimum sizes. Precondition: every value is finite (as read_metrics returns them).
std::string render_svg(const std::vector<Series>& series, const PlotOptions& options = {});

// An axis. `step` is the smallest 1, 2 or 5 times a power of ten that is at least a fifth of the
// data's range (so the data spans two to five steps); [lo, hi] is the data's range rounded out
// to multiples of `step`. Ticks are drawn at lo, lo + step, ..., hi and labelled with `decimals`
// digits after the point (enough to show `step`).
struct Scale {
  double lo = 0, hi = 1, step = 0.2;
  int decimals = 1;
  std::vector<double> ticks() const;
};

// The axis for data in [min, max]. With whole_numbers (steps, epochs) the step is at least 1.
// A zero-width range is widened around its value (by 1 for whole numbers, else by a tenth of the
// value, or 1 for zero) so a constant or one-point series still gets an axis.
// Precondition: min <= max, both finite.
Scale nice_scale(double min, double max, bool whole_numbers);

}  // namespace cohort::report
