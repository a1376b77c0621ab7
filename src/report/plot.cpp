// Training curves: the metrics reader (nlohmann::json per line, every field validated) and the
// SVG writer (two panels, "nice" axes, a legend). The SVG is plain text built here, not through
// an XML library: every piece of caller text goes through xml_escaped.
#include "cohort/report/plot.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "cohort/core/error.hpp"

namespace cohort::report {

namespace {

using json = nlohmann::json;

// ---- reading ----

// One line of a metrics file: where errors are reported.
struct Place {
  const std::filesystem::path& file;
  std::size_t line;

  [[noreturn]] void fail(const std::string& field, const std::string& expected,
                         const std::string& found, const std::string& hint = "") const {
    throw InputError(file.string() + ":" + std::to_string(line) + ": " + field + ": expected " +
                     expected + ", found " + found + (hint.empty() ? "" : " (" + hint + ")"));
  }
};

// A JSON value as the user wrote it, shortened so one bad field cannot flood the message.
std::string shown(const json& value) {
  constexpr std::size_t kMaxChars = 40;
  std::string text = value.dump();
  return text.size() > kMaxChars ? text.substr(0, kMaxChars) + "..." : text;
}

// nlohmann's messages read "[json.exception.<kind>.<id>] <reason>"; keep the reason.
std::string reason(const json::exception& e) {
  const std::string text = e.what();
  const auto end = text.find("] ");
  return end == std::string::npos ? text : text.substr(end + 2);
}

json parse_line(const Place& at, const std::string& text) {
  // The last top-level key read names the field when the parse fails inside or after its value.
  std::string last_key;
  json line;
  try {
    line = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1) last_key = parsed.get<std::string>();
      return true;
    });
  } catch (const json::parse_error& e) {
    // The reason starts "parse error at line 1, column N: "; the line is the file's, not 1.
    const std::string detail = reason(e);
    const auto colon = detail.find(": ");
    at.fail(last_key.empty() ? "line" : last_key, last_key.empty() ? "a JSON object" : "JSON",
            "text that is not JSON (column " + std::to_string(e.byte) + ": " +
                (colon == std::string::npos ? detail : detail.substr(colon + 2)) + ")",
            "a line cut short by a crash, or a run still writing?");
  } catch (const json::exception& e) {  // out_of_range 406: a number beyond a double's range
    at.fail(last_key.empty() ? "line" : last_key, "a finite number",
            "a number beyond a double's range (" + reason(e) + ")");
  }
  if (!line.is_object()) at.fail("line", "a JSON object", shown(line));
  return line;
}

const json& field(const Place& at, const json& line, const char* name, const char* expected) {
  const auto it = line.find(name);
  if (it == line.end()) at.fail(name, expected, "no such field");
  return *it;
}

std::uint64_t whole_number(const Place& at, const json& line, const char* name, std::uint64_t min) {
  const std::string expected = "an integer >= " + std::to_string(min);
  const json& value = field(at, line, name, expected.c_str());
  if (!value.is_number_unsigned() || value.get<std::uint64_t>() < min)
    at.fail(name, expected, shown(value));
  return value.get<std::uint64_t>();
}

double finite_number(const Place& at, const json& line, const char* name) {
  // Bounded so that an axis over the values and its ticks stay finite (nice_scale).
  const char* expected = "a number of magnitude at most 1e300";
  const json& value = field(at, line, name, expected);
  if (!value.is_number() || !(std::abs(value.get<double>()) <= 1e300))
    at.fail(name, expected, shown(value));
  return value.get<double>();
}

double fraction(const Place& at, const json& line, const char* name) {
  const char* expected = "a number in [0, 1]";
  const json& value = field(at, line, name, expected);
  if (!value.is_number() || !(value.get<double>() >= 0 && value.get<double>() <= 1))
    at.fail(name, expected, shown(value));
  return value.get<double>();
}

void check_increasing(const Place& at, const char* name, std::uint64_t previous,
                      std::uint64_t value, const char* kind) {
  if (value <= previous)
    at.fail(name,
            "more than " + std::to_string(previous) + " (the previous " + kind + " line's " + name +
                ")",
            std::to_string(value), "two runs written to one file?");
}

// ---- scales and coordinates ----

// The part of a panel where data is drawn, in SVG pixels (y grows downwards).
struct Frame {
  double left = 0, top = 0, width = 0, height = 0;
  double right() const { return left + width; }
  double bottom() const { return top + height; }
};

struct Axes {
  Frame plot;
  Scale x, y;
  double px(double v) const { return plot.left + plot.width * (v - x.lo) / (x.hi - x.lo); }
  // Larger values are drawn higher, at smaller y.
  double py(double v) const { return plot.bottom() - plot.height * (v - y.lo) / (y.hi - y.lo); }
};

// Bounds of every value `of` picks from `items`, widened into `bounds` (lo, hi).
template <typename Items, typename Of>
void extend(std::pair<double, double>& bounds, const Items& items, Of of) {
  for (const auto& item : items) {
    bounds.first = std::min(bounds.first, double(of(item)));
    bounds.second = std::max(bounds.second, double(of(item)));
  }
}

constexpr std::pair<double, double> kNoBounds{INFINITY, -INFINITY};

bool has_values(const std::pair<double, double>& bounds) { return bounds.first <= bounds.second; }

// ---- drawing ----

// Tableau 10: distinct on white and for the common colour-vision deficiencies.
constexpr std::array<const char*, 10> kColours = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                  "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                                                  "#9c755f", "#bab0ac"};
constexpr const char* kInk = "#222222";        // text
constexpr const char* kAxis = "#888888";       // frame and tick marks
constexpr const char* kGrid = "#e6e6e6";       // grid lines
constexpr const char* kLegendInk = "#555555";  // the legend's key to the mark shapes

// Layout in pixels. Margins hold the panel title (top), tick labels and axis titles.
constexpr double kMarginLeft = 68, kMarginRight = 20, kMarginTop = 34, kMarginBottom = 46;
constexpr double kTitleHeight = 30, kTopPadding = 8, kLegendRow = 20, kLegendPadding = 10;
constexpr double kTickLength = 4, kMarkerRadius = 3.5;
constexpr int kMinWidth = 600, kMinPanelHeight = 200;

const char* colour(std::size_t series) { return kColours[series % kColours.size()]; }

std::string xml_escaped(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 forbids control characters other than tab, newline and carriage return.
        out +=
            (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') ? '?' : c;
    }
  }
  return out;
}

// A coordinate: two decimals are a hundredth of a pixel.
std::string num(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", v);
  return text;
}

std::string tick_label(double v, int decimals) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", decimals, v);
  return text;
}

// text-anchor: "start", "middle" or "end". `extra` is appended inside the element's tag.
void text(std::string& svg, double x, double y, const std::string& content, const char* anchor,
          const std::string& extra = "") {
  svg += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"" + anchor + "\"" + extra +
         ">" + xml_escaped(content) + "</text>\n";
}

void line(std::string& svg, double x1, double y1, double x2, double y2, const char* stroke) {
  svg += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" +
         num(y2) + "\" stroke=\"" + stroke + "\"/>\n";
}

void polyline(std::string& svg, const char* kind, const std::vector<std::pair<double, double>>& xy,
              const char* stroke) {
  svg += "<polyline class=\"" + std::string(kind) + "\" fill=\"none\" stroke=\"" + stroke +
         "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"";
  for (std::size_t i = 0; i < xy.size(); ++i)
    svg += (i ? " " : "") + num(xy[i].first) + "," + num(xy[i].second);
  svg += "\"/>\n";
}

// Filled circle (filled = true) or hollow square, with a tooltip.
void marker(std::string& svg, const char* kind, double x, double y, const char* stroke, bool filled,
            const std::string& tooltip) {
  if (filled)
    svg += "<circle class=\"" + std::string(kind) + "\" cx=\"" + num(x) + "\" cy=\"" + num(y) +
           "\" r=\"" + num(kMarkerRadius) + "\" fill=\"" + stroke + "\">";
  else
    svg += "<rect class=\"" + std::string(kind) + "\" x=\"" + num(x - kMarkerRadius) + "\" y=\"" +
           num(y - kMarkerRadius) + "\" width=\"" + num(2 * kMarkerRadius) + "\" height=\"" +
           num(2 * kMarkerRadius) + "\" fill=\"white\" stroke=\"" + stroke +
           "\" stroke-width=\"1.5\">";
  svg += "<title>" + xml_escaped(tooltip) + "</title>";
  svg += filled ? "</circle>\n" : "</rect>\n";
}

// The plot area of a panel whose outer box starts at (left, top).
Frame plot_frame(double left, double top, double panel_width, double panel_height) {
  return {left + kMarginLeft, top + kMarginTop, panel_width - kMarginLeft - kMarginRight,
          panel_height - kMarginTop - kMarginBottom};
}

void panel_title(std::string& svg, const Frame& plot, const std::string& title) {
  text(svg, plot.left + plot.width / 2, plot.top - 14, title, "middle",
       " font-size=\"14\" font-weight=\"bold\"");
}

void plot_area(std::string& svg, const Frame& plot) {
  svg += "<rect class=\"plot-area\" x=\"" + num(plot.left) + "\" y=\"" + num(plot.top) +
         "\" width=\"" + num(plot.width) + "\" height=\"" + num(plot.height) +
         "\" fill=\"none\" stroke=\"" + kAxis + "\"/>\n";
}

// Grid, tick marks, tick labels, axis titles and the frame (drawn last, over the grid).
void draw_axes(std::string& svg, const Axes& a, const std::string& x_title,
               const std::string& y_title) {
  for (const double v : a.x.ticks()) {
    const double x = a.px(v);
    line(svg, x, a.plot.top, x, a.plot.bottom(), kGrid);
    line(svg, x, a.plot.bottom(), x, a.plot.bottom() + kTickLength, kAxis);
    text(svg, x, a.plot.bottom() + kTickLength + 13, tick_label(v, a.x.decimals), "middle");
  }
  for (const double v : a.y.ticks()) {
    const double y = a.py(v);
    line(svg, a.plot.left, y, a.plot.right(), y, kGrid);
    line(svg, a.plot.left - kTickLength, y, a.plot.left, y, kAxis);
    text(svg, a.plot.left - kTickLength - 3, y + 4, tick_label(v, a.y.decimals), "end");
  }
  text(svg, a.plot.left + a.plot.width / 2, a.plot.bottom() + 38, x_title, "middle");
  const double title_x = a.plot.left - kMarginLeft + 16, title_y = a.plot.top + a.plot.height / 2;
  text(svg, title_x, title_y, y_title, "middle",
       " transform=\"rotate(-90 " + num(title_x) + " " + num(title_y) + ")\"");
  plot_area(svg, a.plot);
}

void draw_empty(std::string& svg, const Frame& plot, const std::string& message) {
  plot_area(svg, plot);
  text(svg, plot.left + plot.width / 2, plot.top + plot.height / 2, message, "middle",
       std::string(" fill=\"") + kAxis + "\"");
}

void draw_loss_panel(std::string& svg, const std::vector<Series>& series, const Frame& plot) {
  panel_title(svg, plot, "Loss");
  auto steps = kNoBounds, losses = kNoBounds;
  for (const Series& s : series) {
    extend(steps, s.steps, [](const StepPoint& p) { return p.step; });
    extend(steps, s.epochs, [](const EpochPoint& p) { return p.step; });
    extend(losses, s.steps, [](const StepPoint& p) { return p.loss; });
    extend(losses, s.epochs, [](const EpochPoint& p) { return p.train_loss; });
    extend(losses, s.epochs, [](const EpochPoint& p) { return p.test_loss; });
  }
  if (!has_values(steps)) return draw_empty(svg, plot, "no step or epoch results");
  const Axes a{plot, nice_scale(steps.first, steps.second, true),
               nice_scale(losses.first, losses.second, false)};
  draw_axes(svg, a, "training step", "loss");
  for (std::size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    if (!s.steps.empty()) {
      std::vector<std::pair<double, double>> xy;
      for (const StepPoint& p : s.steps) xy.emplace_back(a.px(double(p.step)), a.py(p.loss));
      polyline(svg, "step-loss", xy, colour(i));
      // A polyline of one point draws nothing: mark it.
      if (xy.size() == 1)
        marker(svg, "step-loss", xy[0].first, xy[0].second, colour(i), true,
               s.label + ", step " + std::to_string(s.steps[0].step));
    }
    for (const EpochPoint& p : s.epochs) {
      const std::string where =
          s.label + ", epoch " + std::to_string(p.epoch) + " (step " + std::to_string(p.step) + ")";
      marker(svg, "train-loss", a.px(double(p.step)), a.py(p.train_loss), colour(i), true,
             where + ": train loss " + tick_label(p.train_loss, 4));
      marker(svg, "test-loss", a.px(double(p.step)), a.py(p.test_loss), colour(i), false,
             where + ": test loss " + tick_label(p.test_loss, 4));
    }
  }
}

void draw_accuracy_panel(std::string& svg, const std::vector<Series>& series, const Frame& plot) {
  panel_title(svg, plot, "Test accuracy");
  auto epochs = kNoBounds, accuracies = kNoBounds;
  for (const Series& s : series) {
    extend(epochs, s.epochs, [](const EpochPoint& p) { return p.epoch; });
    extend(accuracies, s.epochs, [](const EpochPoint& p) { return p.test_accuracy; });
  }
  if (!has_values(epochs)) return draw_empty(svg, plot, "no epoch results");
  const Axes a{plot, nice_scale(epochs.first, epochs.second, true),
               nice_scale(accuracies.first, accuracies.second, false)};
  draw_axes(svg, a, "epoch", "test accuracy");
  for (std::size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    if (s.epochs.empty()) continue;
    std::vector<std::pair<double, double>> xy;
    for (const EpochPoint& p : s.epochs)
      xy.emplace_back(a.px(double(p.epoch)), a.py(p.test_accuracy));
    polyline(svg, "test-accuracy", xy, colour(i));
    for (std::size_t e = 0; e < xy.size(); ++e)
      marker(svg, "test-accuracy", xy[e].first, xy[e].second, colour(i), true,
             s.label + ", epoch " + std::to_string(s.epochs[e].epoch) + ": test accuracy " +
                 tick_label(s.epochs[e].test_accuracy, 4));
  }
}

// Roughly what `text` takes at font-size 12 in a sans-serif font; for laying out the legend.
double estimated_width(const std::string& text) { return 7.0 * double(text.size()); }

// Under the panels: a key to the marks of the loss panel, then one row per series in its colour.
void draw_legend(std::string& svg, const std::vector<Series>& series, double left, double top) {
  svg += "<g class=\"legend\">\n";
  const double key_y = top + kLegendRow / 2;
  double x = left;
  auto key = [&](const std::string& what, double swatch_width) {
    text(svg, x + swatch_width + 6, key_y + 4, what, "start");
    x += swatch_width + 6 + estimated_width(what) + 24;
  };
  line(svg, x, key_y, x + 20, key_y, kLegendInk);
  key("train loss per log interval", 20);
  marker(svg, "key", x + kMarkerRadius, key_y, kLegendInk, true, "train loss");
  key("epoch train loss", 2 * kMarkerRadius);
  marker(svg, "key", x + kMarkerRadius, key_y, kLegendInk, false, "test loss");
  key("epoch test loss", 2 * kMarkerRadius);
  for (std::size_t i = 0; i < series.size(); ++i) {
    const double y = top + kLegendRow * double(i + 1) + kLegendRow / 2;
    svg += "<line x1=\"" + num(left) + "\" y1=\"" + num(y) + "\" x2=\"" + num(left + 20) +
           "\" y2=\"" + num(y) + "\" stroke=\"" + colour(i) + "\" stroke-width=\"3\"/>\n";
    text(svg, left + 26, y + 4, series[i].label, "start", " class=\"series-label\"");
  }
  svg += "</g>\n";
}

}  // namespace

Series read_metrics(const std::filesystem::path& path) {
  std::error_code ec;
  std::ifstream in(path);
  if (!std::filesystem::is_regular_file(path, ec) || !in)
    throw InputError(path.string() +
                     ": metrics: expected a readable JSON Lines file (cohort train --metrics), "
                     "found " +
                     (std::filesystem::exists(path, ec) ? "something else" : "nothing"));
  Series series;
  series.label = path.filename().string();
  std::string text;
  std::size_t lines = 0;
  while (std::getline(in, text)) {
    const Place at{path, ++lines};
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json line = parse_line(at, text);
    const json& kind = field(at, line, "kind", "a string (\"step\", \"epoch\", ...)");
    if (!kind.is_string()) at.fail("kind", "a string (\"step\", \"epoch\", ...)", shown(kind));
    if (kind == "step") {
      const StepPoint p{whole_number(at, line, "step", 0), finite_number(at, line, "loss")};
      if (!series.steps.empty())
        check_increasing(at, "step", series.steps.back().step, p.step, "step");
      series.steps.push_back(p);
    } else if (kind == "epoch") {
      const EpochPoint p{whole_number(at, line, "epoch", 1), whole_number(at, line, "step", 0),
                         finite_number(at, line, "train_loss"),
                         finite_number(at, line, "test_loss"), fraction(at, line, "test_accuracy")};
      if (!series.epochs.empty()) {
        check_increasing(at, "epoch", series.epochs.back().epoch, p.epoch, "epoch");
        check_increasing(at, "step", series.epochs.back().step, p.step, "epoch");
      }
      series.epochs.push_back(p);
    }
    // Other kinds are later additions to the format; the plot does not draw them.
  }
  if (in.bad()) throw InputError(path.string() + ": metrics: read failed");
  if (series.steps.empty() && series.epochs.empty())
    throw InputError(path.string() +
                     ": metrics: expected at least one line of kind \"step\" or \"epoch\", found "
                     "none in " +
                     std::to_string(lines) + " lines (was --log-every 0 and no epoch finished?)");
  return series;
}

std::vector<double> Scale::ticks() const {
  // Index ticks by integer so no error accumulates, and so 0 is exactly 0 (never "-0.0").
  std::vector<double> values;
  const auto first = std::llround(lo / step), last = std::llround(hi / step);
  for (auto i = first; i <= last; ++i) values.push_back(double(i) * step);
  return values;
}

Scale nice_scale(double min, double max, bool whole_numbers) {
  COHORT_CHECK(std::isfinite(min) && std::isfinite(max) && min <= max,
               "nice_scale(" + std::to_string(min) + ", " + std::to_string(max) + ")");
  constexpr double kTargetSteps = 5;
  // Relative slack for values that are a multiple of the step up to rounding (0.8 / 0.2).
  constexpr double kSlack = 1e-9;
  if (max - min <= kSlack * std::max(std::abs(min), std::abs(max))) {
    const double widen = whole_numbers ? 1 : (min == 0 ? 1 : std::abs(min) / 10);
    min -= widen;
    max += widen;
  }
  const double raw = (max - min) / kTargetSteps;
  int exponent = int(std::floor(std::log10(raw)));
  const double normalized = raw / std::pow(10.0, exponent);  // in [1, 10) up to rounding
  double multiple = 10;
  for (const double m : {1.0, 2.0, 5.0})
    if (normalized <= m * (1 + kSlack)) {
      multiple = m;
      break;
    }
  if (multiple == 10) {
    multiple = 1;
    ++exponent;
  }
  Scale s;
  s.step = multiple * std::pow(10.0, exponent);
  s.decimals = std::max(0, -exponent);
  if (whole_numbers && s.step < 1) {
    s.step = 1;
    s.decimals = 0;
  }
  s.lo = std::floor(min / s.step + kSlack) * s.step;
  s.hi = std::ceil(max / s.step - kSlack) * s.step;
  return s;
}

std::string render_svg(const std::vector<Series>& series, const PlotOptions& options) {
  if (options.width < kMinWidth)
    throw InputError("plot width: expected >= " + std::to_string(kMinWidth) + " pixels, found " +
                     std::to_string(options.width));
  if (options.panel_height < kMinPanelHeight)
    throw InputError("plot panel height: expected >= " + std::to_string(kMinPanelHeight) +
                     " pixels, found " + std::to_string(options.panel_height));
  const double panel_width = options.width / 2.0, panel_height = options.panel_height;
  const double panels_top = options.title.empty() ? kTopPadding : kTitleHeight;
  const double legend_top = panels_top + panel_height;
  const double height = legend_top + kLegendRow * double(series.size() + 1) + kLegendPadding;

  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(options.width) +
         "\" height=\"" + num(height) + "\" viewBox=\"0 0 " + std::to_string(options.width) + " " +
         num(height) + "\" font-family=\"sans-serif\" font-size=\"12\" fill=\"" + kInk + "\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  if (!options.title.empty())
    text(svg, options.width / 2.0, 21, options.title, "middle",
         " font-size=\"16\" font-weight=\"bold\"");
  svg += "<g id=\"loss-panel\">\n";
  draw_loss_panel(svg, series, plot_frame(0, panels_top, panel_width, panel_height));
  svg += "</g>\n<g id=\"accuracy-panel\">\n";
  draw_accuracy_panel(svg, series, plot_frame(panel_width, panels_top, panel_width, panel_height));
  svg += "</g>\n";
  draw_legend(svg, series, kMarginLeft, legend_top);
  svg += "</svg>\n";
  return svg;
}

}  // namespace cohort::report
