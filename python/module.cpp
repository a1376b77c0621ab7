// The `cohort` Python package's native part, `cohort._cohort`: cohort's commands as calls
// (cohort/cli/session.hpp) with NumPy arrays in and out. The package's Python half
// (cohort/__init__.py) turns keyword arguments into the flags and results into objects.
//
// A run trains on a thread of its own with SIGINT and SIGTERM blocked, so that they reach the
// calling (Python) thread alone. That thread waits without the GIL, waking every
// kSignalPoll to let Python run its signal handlers: a KeyboardInterrupt asks the run to stop
// after its step (it saves, as after Ctrl-C in `cohort train`) and is raised when the run ends.
// Callbacks run on the training thread with the GIL held.
#include <pthread.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/cli/cli.hpp"
#include "cohort/cli/session.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/npy.hpp"
#include "cohort/data/text.hpp"
#include "cohort/export/export.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/tokenizer/bpe.hpp"
#include "cohort/version.hpp"

namespace py = pybind11;
using nlohmann::json;

namespace cohort::python {

namespace {

constexpr auto kSignalPoll = std::chrono::milliseconds(50);

// A JSON value (a metrics line, a summary) as Python objects.
py::object to_python(const json& j) {
  switch (j.type()) {
    case json::value_t::object: {
      py::dict d;
      for (const auto& [key, value] : j.items()) d[py::str(key)] = to_python(value);
      return d;
    }
    case json::value_t::array: {
      py::list l;
      for (const json& value : j) l.append(to_python(value));
      return l;
    }
    case json::value_t::string:
      return py::str(j.get_ref<const std::string&>());
    case json::value_t::boolean:
      return py::bool_(j.get<bool>());
    case json::value_t::number_integer:
      return py::int_(j.get<std::int64_t>());
    case json::value_t::number_unsigned:
      return py::int_(j.get<std::uint64_t>());
    case json::value_t::number_float:
      return py::float_(j.get<double>());
    default:
      return py::none();
  }
}

// NumPy arrays given as data, held (with their buffers) while a call reads them without the GIL.
// Each is used in place when it is C-contiguous, else through a C-contiguous copy.
class Arrays {
 public:
  Arrays() = default;
  // `names`: each array's name in messages ("x_train", ...). Throws InputError for an array of
  // an unsupported byte order or dtype kind; the data module checks the rest.
  Arrays(const py::sequence& arrays, const std::vector<std::string>& names) {
    for (std::size_t i = 0; i < names.size(); ++i) {
      py::array a = py::array::ensure(arrays[i], py::array::c_style);
      if (!a) throw InputError(names[i] + ": expected a NumPy array (or what numpy.asarray takes)");
      const py::dtype dt = a.dtype();
      const char order = dt.byteorder();
      if (order == '>')
        throw InputError(names[i] + ": dtype: expected little-endian, found big-endian '" +
                         std::string(py::str(py::handle(dt))) + "' (use .astype(its '<' form))");
      data::ArrayView v;
      v.kind = dt.kind();
      v.item_size = static_cast<std::size_t>(dt.itemsize());
      for (py::ssize_t d = 0; d < a.ndim(); ++d)
        v.shape.push_back(static_cast<std::uint64_t>(a.shape(d)));
      v.payload = {static_cast<const std::uint8_t*>(a.data()),
                   static_cast<std::size_t>(a.nbytes())};
      v.source = names[i];
      v.dtype_field = "dtype";
      v.shape_field = "shape";
      if (v.kind == 'b') v.kind = 'u';  // numpy bool: one unsigned byte
      views_.push_back(std::move(v));
      held_.push_back(std::move(a));
    }
  }
  const std::vector<data::ArrayView>& views() const { return views_; }
  bool empty() const { return views_.empty(); }

  // The splits these arrays hold for a model whose windows are `block` + 1 tokens (0: a
  // classifier): four arrays (x_train, y_train, x_test, y_test) or two (train_tokens,
  // val_tokens), checked as their .npy files would be.
  data::Splits splits(std::size_t block) const {
    const auto& v = views_;
    if (v.size() == 4) {
      if (block != 0)
        throw InputError(
            "data: expected two token arrays (train_tokens, val_tokens) for a "
            "language model, found four arrays (a classifier's)");
      return data::splits_of_arrays(v[0], v[1], v[2], v[3]);
    }
    if (block == 0)
      throw InputError(
          "data: expected four arrays (x_train, y_train, x_test, y_test) for a "
          "classifier, found two token arrays (a language model's)");
    return data::text_splits(data::token_arrays(v[0], v[1], block), block);
  }

 private:
  std::vector<py::array> held_;
  std::vector<data::ArrayView> views_;
};

// The arrays of `data` when it is a sequence of them (a folder's path returns an empty set).
Arrays arrays_of(const py::object& data) {
  if (data.is_none() || py::isinstance<py::str>(data) || py::hasattr(data, "__fspath__")) return {};
  if (!py::isinstance<py::sequence>(data))
    throw InputError("data: expected a folder or a tuple of arrays, found " +
                     std::string(py::str(py::type::of(data).attr("__name__"))));
  const auto seq = py::reinterpret_borrow<py::sequence>(data);
  if (seq.size() == 4) return Arrays(seq, {"x_train", "y_train", "x_test", "y_test"});
  if (seq.size() == 2) return Arrays(seq, {"train_tokens", "val_tokens"});
  throw InputError(
      "data: expected (x_train, y_train, x_test, y_test) or (train_tokens, "
      "val_tokens), found a sequence of " +
      std::to_string(seq.size()));
}

// A Python exception raised on another thread, kept (with the GIL) to be raised on this one.
struct PendingError {
  py::object type, value, trace;
  explicit operator bool() const { return static_cast<bool>(type); }
  void take_current() {  // PyErr_Fetch's triple; the GIL held
    PyObject *t = nullptr, *v = nullptr, *tb = nullptr;
    PyErr_Fetch(&t, &v, &tb);
    type = py::reinterpret_steal<py::object>(t);
    value = py::reinterpret_steal<py::object>(v);
    trace = py::reinterpret_steal<py::object>(tb);
  }
  [[noreturn]] void raise() {
    PyErr_Restore(type.release().ptr(), value.release().ptr(), trace.release().ptr());
    throw py::error_already_set();
  }
};

// On a thread Python did not start, for its lifetime: the thread's Python state, made once, so
// that each callback's GIL acquisition only takes the lock (without it, every acquisition would
// create and destroy a thread state: most of a dispatch's time). Neither holds the GIL after
// construction.
class PythonThread {
 public:
  PythonThread() : keep_(std::in_place), released_(std::in_place) {}
  ~PythonThread() {
    released_.reset();  // takes the GIL back, then `keep_` drops it and the state
    keep_.reset();
  }
  PythonThread(const PythonThread&) = delete;
  PythonThread& operator=(const PythonThread&) = delete;

 private:
  std::optional<py::gil_scoped_acquire> keep_;
  std::optional<py::gil_scoped_release> released_;
};

// Calls `callback` with `line` (the GIL held); false from it (not None, not other values) stops
// the run. A raised exception is kept in `error` and stops the run too.
bool dispatch(const py::function& callback, const json& line, PendingError& error) {
  py::gil_scoped_acquire gil;
  if (error) return false;
  try {
    const py::object r = callback(to_python(line));
    return r.ptr() != Py_False;
  } catch (py::error_already_set& e) {
    e.restore();
    error.take_current();
    return false;
  }
}

// Runs `work` on a thread with SIGINT and SIGTERM blocked while this thread waits without the
// GIL and lets Python handle signals every kSignalPoll: the first KeyboardInterrupt (or any
// exception a signal handler raises) sets `stop` and is kept in `interrupt`.
template <typename Work>
void run_beside_python(Work work, std::atomic<bool>& stop, PendingError& interrupt) {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  sigset_t blocked, old;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &blocked, &old);  // the thread inherits it
  std::thread worker([&] {
    work();
    const std::lock_guard lock(m);
    done = true;
    cv.notify_all();
  });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  {
    py::gil_scoped_release nogil;
    std::unique_lock lock(m);
    while (!cv.wait_for(lock, kSignalPoll, [&] { return done; })) {
      lock.unlock();
      {
        py::gil_scoped_acquire gil;
        if (!interrupt && PyErr_CheckSignals() != 0) {
          interrupt.take_current();
          stop.store(true, std::memory_order_relaxed);
        }
      }
      lock.lock();
    }
  }
  worker.join();
}

py::dict train(const std::vector<std::string>& args, const py::object& data,
               const std::optional<py::function>& on_line) {
  const Arrays arrays = arrays_of(data);
  cli::Loaders loaders = cli::disk_loaders();
  cli::TrainHooks hooks;
  hooks.take_signals = false;
  if (!arrays.empty()) {
    hooks.data_name = "(arrays)";
    loaders.data = [&arrays](const std::string&, std::size_t block) {
      return std::make_shared<const data::Splits>(arrays.splits(block));
    };
  }
  std::atomic<bool> stop{false};
  hooks.stop = [&stop] { return stop.load(std::memory_order_relaxed); };
  PendingError callback_error, interrupt;
  if (on_line)
    hooks.on_line = [&](const json& line) { return dispatch(*on_line, line, callback_error); };
  cli::TrainOutcome outcome;
  std::exception_ptr failure;
  run_beside_python(
      [&] {
        try {
          std::optional<PythonThread> python;  // the callbacks' thread state
          if (on_line) python.emplace();
          outcome = cli::train(args, loaders, hooks, std::cout, std::cerr);
        } catch (...) {
          failure = std::current_exception();
        }
        std::cout.flush();
      },
      stop, interrupt);
  if (interrupt) interrupt.raise();
  if (callback_error) callback_error.raise();
  if (failure) std::rethrow_exception(failure);
  py::dict result;
  result["summary"] = to_python(outcome.summary);
  result["stopped"] = outcome.stopped;
  return result;
}

// A checkpoint read into memory: what `cohort.load` returns.
struct Loaded {
  std::string path;
  checkpoint::Checkpoint ck;
};

// The state_dict `cohort export` writes, as NumPy arrays under its names, in its order.
py::dict weights(const Loaded& l) {
  const nn::Model model = exporting::checkpoint_model(l.ck, l.path);
  py::dict out;
  for (const nn::StateTensor& t : model.state_dict()) {
    using Source = nn::StateTensor::Source;
    if (t.source == Source::kBatchesTracked) {
      py::array_t<std::int64_t> a(std::vector<py::ssize_t>{});
      *a.mutable_data() = exporting::batches_tracked(l.ck);
      out[py::str(t.name)] = a;
      continue;
    }
    const std::vector<float>& from =
        t.source == Source::kParams ? l.ck.weights : l.ck.running_stats;
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    py::array_t<float> a(shape);
    std::memcpy(a.mutable_data(), from.data() + t.offset, t.numel() * sizeof(float));
    out[py::str(t.name)] = a;
  }
  return out;
}

// `cohort eval`'s figures on `data` (a folder or arrays), as its --summary file has them.
py::dict evaluate(const Loaded& l, const py::object& data, std::size_t workers) {
  const auto block = static_cast<std::size_t>(nn::spec_window(l.ck.model));
  const Arrays arrays = arrays_of(data);
  const std::string folder =
      arrays.empty() ? py::module_::import("os").attr("fspath")(data).cast<std::string>() : "";
  cli::Evaluation e;
  {
    const py::gil_scoped_release nogil;
    const data::Splits splits =
        arrays.empty() ? data::load_data_folder(folder, 10, block) : arrays.splits(block);
    e = cli::evaluate(l.ck, l.path, splits, workers);
  }
  py::dict out;
  out["checkpoint"] = l.path;
  out["model"] = l.ck.model;
  out["step"] = l.ck.step;
  out["test_loss"] = e.loss;
  out["test_accuracy"] = e.accuracy;
  out["weights_digest"] = e.digest;
  if (e.language_model) {
    out["val_loss"] = e.loss;
    out["val_bpc"] = e.loss / std::log(2.0);
  }
  return out;
}

// A classifier's logits (N, classes) for the samples `x` (uint8 pixels or float32 features).
py::array_t<float> logits(const Loaded& l, const py::object& x) {
  std::vector<std::uint8_t> zeros;
  py::list pair;
  pair.append(x);
  const Arrays rows(pair, {"x"});
  const data::ArrayView& xv = rows.views()[0];
  zeros.assign(xv.shape.empty() ? 0 : static_cast<std::size_t>(xv.shape[0]), 0);
  const data::ArrayView y{.kind = 'u',
                          .item_size = 1,
                          .shape = {zeros.size()},
                          .payload = {zeros.data(), zeros.size()},
                          .source = "labels of x"};
  std::vector<float> values;
  std::size_t n = 0;
  {
    const py::gil_scoped_release nogil;
    const data::Dataset set = data::split_of_arrays(xv, y, "x");
    n = set.count;
    values = cli::logits(l.ck, l.path, set);
  }
  const std::size_t classes = n ? values.size() / n : 0;
  py::array_t<float> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(classes)});
  std::memcpy(out.mutable_data(), values.data(), values.size() * sizeof(float));
  return out;
}

// The mean seconds of one dispatch of `callback` with a step's line, over `n` calls from a
// thread other than Python's (as a run's), the GIL released by the caller: what a run adds to a
// step for its on_step.
double dispatch_seconds(const py::function& callback, std::size_t n) {
  const json line{{"kind", "step"}, {"step", 1},  {"epoch", 0},
                  {"loss", 2.302},  {"lr", 0.05}, {"elapsed_s", 0.5}};
  PendingError error;
  double seconds = 0;
  {
    const py::gil_scoped_release nogil;
    std::thread t([&] {
      const PythonThread python;
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < n; ++i) dispatch(callback, line, error);
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    t.join();
  }
  if (error) error.raise();
  return seconds / static_cast<double>(std::max<std::size_t>(1, n));
}

}  // namespace

}  // namespace cohort::python

namespace cohort::python {
namespace {

// Text as bytes: a str is its UTF-8, bytes are themselves.
std::string bytes_of(const py::object& text) {
  if (py::isinstance<py::bytes>(text)) return text.cast<std::string>();
  return py::str(text).cast<std::string>();
}

}  // namespace
}  // namespace cohort::python

PYBIND11_MODULE(_cohort, m) {
  using namespace cohort;
  using namespace cohort::python;
  m.doc() = "cohort's engine: see the cohort package (docs/python.md)";
  static py::exception<InputError> input_error(m, "InputError", PyExc_ValueError);
  static py::exception<OutputError> output_error(m, "OutputError", PyExc_OSError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(input_error.ptr(), e.what());
    } catch (const OutputError& e) {
      PyErr_SetString(output_error.ptr(), e.what());
    }
  });
  m.attr("__version__") = COHORT_VERSION;
  m.def("train", &train, py::arg("args"), py::arg("data"), py::arg("on_line"),
        "`cohort train ARGS` with `data` a folder (None: --data's) or arrays; returns "
        "{'summary': ..., 'stopped': ...}");
  m.def(
      "config_keys",
      [] {
        py::dict keys;  // TOML key -> flag
        for (const config::Key& k : cli::train_schema()) keys[py::str(k.toml)] = k.flag;
        return keys;
      },
      "the job config's keys: {toml_key: flag}");
  m.def("version_text", &cli::version_text, "what `cohort --version` prints");
  m.def("dispatch_seconds", &dispatch_seconds, py::arg("callback"), py::arg("n"),
        "mean seconds of one on_step dispatch (a benchmark)");
  py::class_<tokenizer::Bpe>(m, "Tokenizer")
      .def(py::init([](const std::string& dir) { return tokenizer::Bpe::load(dir); }),
           py::arg("dir"))
      .def(
          "encode",
          [](const tokenizer::Bpe& b, const py::object& text) {
            const std::vector<std::uint32_t> ids = b.encode(bytes_of(text));
            py::array_t<std::uint32_t> out(static_cast<py::ssize_t>(ids.size()));
            std::copy(ids.begin(), ids.end(), out.mutable_data());
            return out;
          },
          py::arg("text"))
      .def(
          "decode",
          [](const tokenizer::Bpe& b, const std::vector<std::int64_t>& ids) {
            std::string out;
            for (const std::int64_t id : ids) {
              if (id < 0 || static_cast<std::size_t>(id) >= b.size())
                throw InputError("ids: expected token ids below " + std::to_string(b.size()) +
                                 ", found " + std::to_string(id));
              out += b.bytes_of(static_cast<std::uint32_t>(id));
            }
            return py::bytes(out);
          },
          py::arg("ids"))
      .def("__len__", &tokenizer::Bpe::size);
  m.def(
      "pieces",
      [](const py::object& text) {
        const std::string bytes = bytes_of(text);
        py::list out;
        for (const std::string_view p : tokenizer::pieces(bytes))
          out.append(py::bytes(p.data(), p.size()));
        return out;
      },
      py::arg("text"), "GPT-2's pre-tokenizer: the pieces of `text` (str as UTF-8), as bytes");
  py::class_<Loaded>(m, "Checkpoint")
      .def(py::init([](const std::string& path) {
             return Loaded{path, checkpoint::load_checkpoint(path)};
           }),
           py::arg("path"))
      .def_property_readonly("path", [](const Loaded& l) { return l.path; })
      .def_property_readonly("model", [](const Loaded& l) { return l.ck.model; })
      .def_property_readonly("step", [](const Loaded& l) { return l.ck.step; })
      .def_property_readonly("vocab", [](const Loaded& l) { return l.ck.vocab; })
      .def("weights", &weights)
      .def("evaluate", &evaluate, py::arg("data"), py::arg("workers") = 0)
      .def("logits", &logits, py::arg("x"))
      .def(
          "sample",
          [](const Loaded& l, const std::string& prompt, std::size_t tokens, double temperature,
             std::size_t top_k, std::uint64_t seed, const std::string& tokenizer) {
            const cli::SampleRequest r{.checkpoint = l.path,
                                       .prompt = prompt,
                                       .tokenizer = tokenizer,
                                       .tokens = tokens,
                                       .temperature = temperature,
                                       .top_k = top_k,
                                       .seed = seed};
            std::string text;
            {
              const py::gil_scoped_release nogil;
              text = cli::sample(r);
            }
            return py::bytes(text);  // a token's bytes need not be whole UTF-8 characters
          },
          py::arg("prompt"), py::arg("tokens"), py::arg("temperature"), py::arg("top_k"),
          py::arg("seed"), py::arg("tokenizer"));
}
