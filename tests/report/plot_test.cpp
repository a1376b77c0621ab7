// Training-curve plots: the metrics reader accepts what `cohort train --metrics` writes and
// refuses every malformed line naming file:line and the field; the SVG puts each point where its
// value says (read back from the SVG's coordinates); axes use 1/2/5 x 10^k steps.
#include "cohort/report/plot.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "cohort/core/error.hpp"

namespace cohort::report {
namespace plot_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Point {
  double x, y;
};

struct Box {
  double left, top, width, height;
  bool contains(Point p) const {
    return p.x >= left && p.x <= left + width && p.y >= top && p.y <= top + height;
  }
};

// The elements of one panel: <g id="loss-panel"> ... </g> (panels hold no nested groups).
std::string panel(const std::string& svg, const std::string& id) {
  const auto begin = svg.find("<g id=\"" + id + "\">");
  EXPECT_NE(begin, std::string::npos) << id;
  return svg.substr(begin, svg.find("</g>", begin) - begin);
}

// Every start tag in `svg` that begins with `start` (e.g. `<circle class="train-loss"`), up to
// its '>', in document order.
std::vector<std::string> elements(const std::string& svg, const std::string& start) {
  std::vector<std::string> found;
  for (auto at = svg.find(start); at != std::string::npos; at = svg.find(start, at + 1))
    found.push_back(svg.substr(at, svg.find('>', at) - at));
  return found;
}

// The text of attribute `name` in a start tag.
std::string attribute(const std::string& element, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const auto begin = element.find(key);
  EXPECT_NE(begin, std::string::npos) << name << " in " << element;
  if (begin == std::string::npos) return "";
  const auto value = begin + key.size();
  return element.substr(value, element.find('"', value) - value);
}

double number(const std::string& element, const std::string& name) {
  return std::stod(attribute(element, name));
}

Box plot_area(const std::string& panel_svg) {
  const auto rects = elements(panel_svg, "<rect class=\"plot-area\"");
  EXPECT_EQ(rects.size(), 1u);
  const std::string& r = rects.at(0);
  return {number(r, "x"), number(r, "y"), number(r, "width"), number(r, "height")};
}

// The points of every <polyline class="kind">, in document order.
std::vector<std::vector<Point>> polylines(const std::string& panel_svg, const std::string& kind) {
  std::vector<std::vector<Point>> lines;
  for (const std::string& element : elements(panel_svg, "<polyline class=\"" + kind + "\"")) {
    std::istringstream points(attribute(element, "points"));
    lines.emplace_back();
    Point p;
    char comma;
    while (points >> p.x >> comma >> p.y) lines.back().push_back(p);
  }
  return lines;
}

// Centres of every <circle class="kind"> or <rect class="kind"> marker.
std::vector<Point> markers(const std::string& panel_svg, const std::string& kind) {
  std::vector<Point> centres;
  for (const std::string& c : elements(panel_svg, "<circle class=\"" + kind + "\""))
    centres.push_back({number(c, "cx"), number(c, "cy")});
  for (const std::string& r : elements(panel_svg, "<rect class=\"" + kind + "\""))
    centres.push_back(
        {number(r, "x") + number(r, "width") / 2, number(r, "y") + number(r, "height") / 2});
  return centres;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Lines as `cohort train --metrics` writes them: steps every 2, epochs of 4 steps.
const char* kTwoEpochs =
    R"({"kind":"step","step":2,"epoch":0,"loss":2.0,"elapsed_s":0.1}
{"kind":"step","step":4,"epoch":0,"loss":1.0,"elapsed_s":0.2}
{"kind":"epoch","epoch":1,"step":4,"train_loss":1.5,"test_loss":1.25,"test_accuracy":0.6,"samples_per_second":900,"elapsed_s":0.3}
{"kind":"skip","step":5,"reason":"a future kind of line"}
{"kind":"step","step":6,"epoch":1,"loss":0.75,"elapsed_s":0.4}
{"kind":"step","step":8,"epoch":1,"loss":0.5,"elapsed_s":0.5}
{"kind":"step","step":10,"epoch":1,"loss":0.625,"elapsed_s":0.6}
{"kind":"epoch","epoch":2,"step":10,"train_loss":0.6,"test_loss":0.7,"test_accuracy":0.85,"samples_per_second":950,"elapsed_s":0.7}
)";

class MetricsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cohort_report_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name) << text;
    return dir_ / name;
  }
  fs::path dir_;
};

using PlotReadMetrics = MetricsFiles;
using PlotRenderSvg = MetricsFiles;

TEST_F(PlotReadMetrics, ReadsStepAndEpochLinesSkippingOtherKinds) {
  const Series s = read_metrics(write("run.jsonl", kTwoEpochs));
  EXPECT_EQ(s.label, "run.jsonl");
  ASSERT_EQ(s.steps.size(), 5u);
  EXPECT_EQ(s.steps[0].step, 2u);
  EXPECT_EQ(s.steps[0].loss, 2.0);
  EXPECT_EQ(s.steps[4].step, 10u);
  EXPECT_EQ(s.steps[4].loss, 0.625);
  ASSERT_EQ(s.epochs.size(), 2u);
  EXPECT_EQ(s.epochs[1].epoch, 2u);
  EXPECT_EQ(s.epochs[1].step, 10u);
  EXPECT_EQ(s.epochs[1].train_loss, 0.6);
  EXPECT_EQ(s.epochs[1].test_loss, 0.7);
  EXPECT_EQ(s.epochs[1].test_accuracy, 0.85);
}

// A valid line with one field set to `value`, or removed when `value` is discarded.
std::string changed(const std::string& line, const char* field, const json& value) {
  json j = json::parse(line);
  if (value.is_discarded())
    j.erase(field);
  else
    j[field] = value;
  return j.dump();
}

TEST_F(PlotReadMetrics, RefusesMalformedLinesNamingLineAndField) {
  const std::string step = R"({"kind":"step","step":4,"epoch":0,"loss":1.0})";
  const std::string epoch =
      R"({"kind":"epoch","epoch":2,"step":4,"train_loss":1,"test_loss":1,"test_accuracy":0.5})";
  const json missing(json::value_t::discarded);
  struct Case {
    const char* what;
    std::string line;  // written as line 2, after a valid line of its kind at epoch 1, step 2
    const char* field;
  };
  const Case cases[] = {
      {"not JSON", R"({"kind":"step","step":4,"loss":)", "loss"},
      {"not JSON before any field", "step 4 loss 0.5", "line"},
      {"not an object", "[4, 0.5]", "line"},
      {"no kind", changed(step, "kind", missing), "kind"},
      {"kind not a string", changed(step, "kind", 1), "kind"},
      {"no step", changed(step, "step", missing), "step"},
      {"step a string", changed(step, "step", "4"), "step"},
      {"negative step", changed(step, "step", -4), "step"},
      {"fractional step", changed(step, "step", 4.5), "step"},
      {"non-finite step", R"({"kind":"step","step":1e999,"loss":0.5})", "step"},
      {"repeated step", changed(step, "step", 2), "step"},
      {"decreasing step", changed(step, "step", 1), "step"},
      {"no loss", changed(step, "loss", missing), "loss"},
      {"null loss (NaN as nlohmann writes it)", changed(step, "loss", nullptr), "loss"},
      {"loss a string", changed(step, "loss", "0.5"), "loss"},
      {"epoch 0", changed(epoch, "epoch", 0), "epoch"},
      {"repeated epoch", changed(epoch, "epoch", 1), "epoch"},
      {"epoch's step not increasing", changed(epoch, "step", 2), "step"},
      {"no train_loss", changed(epoch, "train_loss", missing), "train_loss"},
      {"test_loss a bool", changed(epoch, "test_loss", true), "test_loss"},
      {"accuracy above 1", changed(epoch, "test_accuracy", 1.5), "test_accuracy"},
      {"negative accuracy", changed(epoch, "test_accuracy", -0.1), "test_accuracy"},
      {"no accuracy", changed(epoch, "test_accuracy", missing), "test_accuracy"},
  };
  for (const Case& c : cases) {
    const bool epoch_line = c.line.find("\"epoch\",") != std::string::npos;
    const std::string first =
        epoch_line ? changed(changed(epoch, "epoch", 1), "step", 2) : changed(step, "step", 2);
    const fs::path path = write("bad.jsonl", first + "\n" + c.line + "\n" + step + "\n");
    try {
      read_metrics(path);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const InputError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(path.string() + ":2: " + c.field + ": expected ", 0), 0u)
          << c.what << ": " << message;
      EXPECT_NE(message.find(", found "), std::string::npos) << c.what << ": " << message;
    }
  }
}

TEST_F(PlotReadMetrics, RefusesMissingFileAndFileWithoutResults) {
  try {
    read_metrics(dir_ / "absent.jsonl");
    ADD_FAILURE() << "accepted a missing file";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("absent.jsonl: metrics: expected a readable"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("found nothing"), std::string::npos) << e.what();
  }
  for (const std::string text : {"", "\n", "{\"kind\":\"skip\",\"step\":3}\n"}) {
    try {
      read_metrics(write("empty.jsonl", text));
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "empty.jsonl: metrics: expected at least one line of kind \"step\" or "
                    "\"epoch\", found none"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST_F(PlotRenderSvg, StepLossIsOnePolylinePointPerStepLine) {
  const Series s = read_metrics(write("run.jsonl", kTwoEpochs));
  const std::string loss = panel(render_svg({s}), "loss-panel");
  const Box area = plot_area(loss);
  const auto lines = polylines(loss, "step-loss");
  ASSERT_EQ(lines.size(), 1u);
  const std::vector<Point>& xy = lines[0];
  ASSERT_EQ(xy.size(), s.steps.size());
  for (std::size_t i = 0; i < xy.size(); ++i) {
    EXPECT_TRUE(area.contains(xy[i])) << "point " << i << " at " << xy[i].x << "," << xy[i].y;
    if (i == 0) continue;
    EXPECT_GT(xy[i].x, xy[i - 1].x) << i;
    // Steps are 2 apart, so x is too, by the same pixels each time.
    EXPECT_NEAR(xy[i].x - xy[i - 1].x, xy[1].x - xy[0].x, 0.02) << i;
  }
  // A higher loss is higher on the page: smaller y. Losses 2 > 1 > 0.75 > 0.625 > 0.5.
  const std::size_t by_loss[] = {0, 1, 2, 4, 3};
  for (std::size_t i = 1; i < 5; ++i) EXPECT_LT(xy[by_loss[i - 1]].y, xy[by_loss[i]].y) << i;
  // Same loss scale for every value: (y(2) - y(1)) is twice (y(1) - y(0.5)).
  EXPECT_NEAR(xy[1].y - xy[0].y, 2 * (xy[3].y - xy[1].y), 0.02);
}

TEST_F(PlotRenderSvg, EpochMarkersSitAtTheEpochsStep) {
  const Series s = read_metrics(write("run.jsonl", kTwoEpochs));
  const std::string loss = panel(render_svg({s}), "loss-panel");
  const std::vector<Point> steps = polylines(loss, "step-loss").at(0);
  const std::vector<Point> train = markers(loss, "train-loss"), test = markers(loss, "test-loss");
  ASSERT_EQ(train.size(), 2u);
  ASSERT_EQ(test.size(), 2u);
  // Epoch 1 ended at step 4 (the second step line), epoch 2 at step 10 (the fifth).
  EXPECT_NEAR(train[0].x, steps[1].x, 0.01);
  EXPECT_NEAR(train[1].x, steps[4].x, 0.01);
  EXPECT_NEAR(test[0].x, steps[1].x, 0.01);
  EXPECT_NEAR(test[1].x, steps[4].x, 0.01);
  // Train loss 1.5 lies between the step losses 2 and 1; test loss 1.25 below 1.5.
  EXPECT_GT(train[0].y, steps[0].y);
  EXPECT_LT(train[0].y, steps[1].y);
  EXPECT_GT(test[0].y, train[0].y);
  EXPECT_LT(test[1].y, train[1].y);  // 0.7 > 0.6
}

TEST_F(PlotRenderSvg, AccuracyPointsMatchTheEpochs) {
  const std::string accuracy =
      panel(render_svg({read_metrics(write("run.jsonl", kTwoEpochs))}), "accuracy-panel");
  const Box area = plot_area(accuracy);
  const auto lines = polylines(accuracy, "test-accuracy");
  ASSERT_EQ(lines.size(), 1u);
  ASSERT_EQ(lines[0].size(), 2u);
  const std::vector<Point> dots = markers(accuracy, "test-accuracy");
  ASSERT_EQ(dots.size(), 2u);
  for (std::size_t e = 0; e < 2; ++e) {
    EXPECT_TRUE(area.contains(lines[0][e])) << e;
    EXPECT_NEAR(dots[e].x, lines[0][e].x, 0.01) << e;
    EXPECT_NEAR(dots[e].y, lines[0][e].y, 0.01) << e;
  }
  EXPECT_LT(lines[0][0].x, lines[0][1].x);  // epoch 1, then 2
  EXPECT_GT(lines[0][0].y, lines[0][1].y);  // 0.6 below 0.85
  EXPECT_EQ(count(accuracy, "no epoch results"), 0u);
}

TEST_F(PlotRenderSvg, EscapesLabelsForXml) {
  Series s = read_metrics(write("run.jsonl", kTwoEpochs));
  s.label = R"(lr<0.1 & "wide" > 'x')";
  const std::string svg = render_svg({s}, {.title = "runs <&>"});
  EXPECT_NE(svg.find("lr&lt;0.1 &amp; &quot;wide&quot; &gt; &apos;x&apos;"), std::string::npos);
  EXPECT_NE(svg.find("runs &lt;&amp;&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("lr<0.1"), std::string::npos);
  EXPECT_EQ(svg.find("\"wide\""), std::string::npos);
}

TEST_F(PlotRenderSvg, OnePointAndConstantSeriesStayInsideThePanel) {
  const Series one = read_metrics(write("one.jsonl",
                                        R"({"kind":"step","step":7,"loss":0.5}
{"kind":"epoch","epoch":1,"step":7,"train_loss":0.5,"test_loss":0.5,"test_accuracy":0.5}
)"));
  const Series flat = read_metrics(write("flat.jsonl", R"({"kind":"step","step":1,"loss":0}
{"kind":"step","step":2,"loss":0}
{"kind":"step","step":3,"loss":0}
)"));
  for (const Series& s : {one, flat}) {
    const std::string svg = render_svg({s});
    EXPECT_EQ(svg.find("nan"), std::string::npos) << s.label;
    EXPECT_EQ(svg.find("inf"), std::string::npos) << s.label;
    const std::string loss = panel(svg, "loss-panel");
    const Box area = plot_area(loss);
    const std::vector<Point> xy = polylines(loss, "step-loss").at(0);
    ASSERT_EQ(xy.size(), s.steps.size()) << s.label;
    for (const Point& p : xy) {
      EXPECT_TRUE(area.contains(p)) << s.label << " " << p.x << "," << p.y;
      EXPECT_NEAR(p.y, xy[0].y, 0.01) << s.label;
    }
  }
  // A polyline of one point draws nothing, so the lone step gets a marker too.
  EXPECT_EQ(markers(panel(render_svg({one}), "loss-panel"), "step-loss").size(), 1u);
}

TEST_F(PlotRenderSvg, DrawsWhatExistsAndLabelsTheEmptyPanel) {
  const Series steps_only = read_metrics(write("steps.jsonl", R"({"kind":"step","step":1,"loss":1}
{"kind":"step","step":2,"loss":0.5}
)"));
  const std::string svg = render_svg({steps_only});
  EXPECT_EQ(polylines(panel(svg, "loss-panel"), "step-loss").size(), 1u);
  EXPECT_EQ(count(panel(svg, "accuracy-panel"), "no epoch results"), 1u);
  EXPECT_TRUE(polylines(panel(svg, "accuracy-panel"), "test-accuracy").empty());

  const Series epochs_only = read_metrics(write("epochs.jsonl", R"(
{"kind":"epoch","epoch":1,"step":5,"train_loss":1,"test_loss":0.9,"test_accuracy":0.7}
{"kind":"epoch","epoch":2,"step":10,"train_loss":0.8,"test_loss":0.85,"test_accuracy":0.75}
)"));
  const std::string loss = panel(render_svg({epochs_only}), "loss-panel");
  EXPECT_TRUE(polylines(loss, "step-loss").empty());
  EXPECT_EQ(markers(loss, "train-loss").size(), 2u);
  EXPECT_EQ(markers(loss, "test-loss").size(), 2u);
  const Box area = plot_area(loss);
  for (const Point& p : markers(loss, "train-loss")) EXPECT_TRUE(area.contains(p));
}

TEST_F(PlotRenderSvg, SeveralSeriesHaveDistinctColoursAndLegendRows) {
  std::vector<Series> runs;
  for (int r = 0; r < 3; ++r) {
    runs.push_back(read_metrics(write("run" + std::to_string(r) + ".jsonl", kTwoEpochs)));
    for (StepPoint& p : runs.back().steps) p.loss *= 1 + r;
  }
  const std::string svg = render_svg(runs);
  std::set<std::string> colours;
  for (const std::string& line : elements(svg, "<polyline class=\"step-loss\""))
    colours.insert(attribute(line, "stroke"));
  EXPECT_EQ(colours.size(), 3u);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(count(svg, "class=\"series-label\">run" + std::to_string(r) + ".jsonl<"), 1u) << r;
  EXPECT_EQ(polylines(panel(svg, "accuracy-panel"), "test-accuracy").size(), 3u);
}

TEST_F(PlotRenderSvg, RefusesImagesTooSmallToDraw) {
  const Series s = read_metrics(write("run.jsonl", kTwoEpochs));
  EXPECT_THROW(render_svg({s}, {.width = 100}), InputError);
  EXPECT_THROW(render_svg({s}, {.panel_height = 50}), InputError);
  EXPECT_NO_THROW(render_svg({s}, {.width = 600, .panel_height = 200}));
}

void expect_scale(const Scale& s, double lo, double hi, double step, int decimals,
                  std::size_t ticks) {
  EXPECT_DOUBLE_EQ(s.lo, lo);
  EXPECT_DOUBLE_EQ(s.hi, hi);
  EXPECT_DOUBLE_EQ(s.step, step);
  EXPECT_EQ(s.decimals, decimals);
  const std::vector<double> t = s.ticks();
  ASSERT_EQ(t.size(), ticks);
  EXPECT_DOUBLE_EQ(t.front(), lo);
  EXPECT_NEAR(t.back(), hi, 1e-12 * std::max(1.0, std::abs(hi)));
}

// The rule: the smallest {1, 2, 5} x 10^k >= range / 5 (whole numbers: >= 1), ends rounded out to
// multiples of it.
TEST(PlotNiceScale, StepsAreOneTwoOrFiveTimesAPowerOfTen) {
  expect_scale(nice_scale(0, 0.87, false), 0, 1.0, 0.2, 1, 6);  // 0, 0.2, ..., 1.0
  expect_scale(nice_scale(0, 0.8, false), 0, 0.8, 0.2, 1, 5);   // 0.8 / 0.2 is not exactly 4
  expect_scale(nice_scale(0.83, 0.97, false), 0.8, 1.0, 0.05, 2, 5);
  expect_scale(nice_scale(2, 2340, true), 0, 2500, 500, 0, 6);
  expect_scale(nice_scale(0.31, 2.4, false), 0, 2.5, 0.5, 1, 6);  // 2.09 / 5 = 0.418 -> 0.5
  expect_scale(nice_scale(-1.5, 1.5, false), -2, 2, 1, 0, 5);     // 0.6 -> 1 (past 5 x 0.1)
  expect_scale(nice_scale(0.0012, 0.0031, false), 0.001, 0.0035, 0.0005, 4, 6);
  expect_scale(nice_scale(1, 3, true), 1, 3, 1, 0, 3);  // whole numbers never step below 1
}

TEST(PlotNiceScale, ZeroWidthRangesAreWidened) {
  expect_scale(nice_scale(1, 1, true), 0, 2, 1, 0, 3);
  const Scale s = nice_scale(0.61, 0.61, false);
  EXPECT_LT(s.lo, 0.61);
  EXPECT_GT(s.hi, 0.61);
  expect_scale(nice_scale(0, 0, false), -1, 1, 0.5, 1, 5);
}

}  // namespace plot_test
}  // namespace cohort::report
