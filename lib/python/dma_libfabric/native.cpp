// dma_libfabric._native: the passive side of the side channel (a Target on a thread of its own,
// exposing Python buffers without a copy) and the side channel's protocol (its commands' arguments
// and its replies), for the Python package around it.
#include <dma/dma.hpp>
#include <dma/kv/protocol.hpp>
#include <dma/kv/resp.hpp>
#include <dma/target_thread.hpp>
#include <dma/version.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/post.hpp>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace py = pybind11;

namespace {

py::object error_class;  // dma_libfabric.Error, set at import

// The dma::condition `ec` is equivalent to, by name, or "" when none.
const char* condition_of(std::error_code ec) {
  using C = dma::condition;
  const std::pair<C, const char*> names[] = {{C::invalid_advertisement, "invalid_advertisement"},
                                             {C::peer_unreachable, "peer_unreachable"},
                                             {C::invalid_operand, "invalid_operand"},
                                             {C::cancelled, "cancelled"},
                                             {C::connection_lost, "connection_lost"},
                                             {C::remote_access_denied, "remote_access_denied"}};
  for (const auto& [condition, name] : names)
    if (ec && ec == dma::make_error_condition(condition)) return name;
  return "";
}

// Raises dma_libfabric.Error(message, code, category, condition): the library's error code, its
// category, and the library's error condition it belongs to.
[[noreturn]] void raise_error(const std::string& message, std::error_code ec = {}) {
  py::object error = error_class(message, ec.value(), ec ? ec.category().name() : "", condition_of(ec));
  PyErr_SetObject(error_class.ptr(), error.ptr());
  throw py::error_already_set();
}

dma::Target::Access parse_access(std::string_view access) {
  if (access == "read") return dma::Target::Access::read;
  if (access == "write") return dma::Target::Access::write;
  if (access == "read_write") return dma::Target::Access::read_write;
  throw py::value_error("access is 'read', 'write' or 'read_write', not '" + std::string(access) + "'");
}

class Target;

// A Python buffer exposed to the fabric: holds the buffer (so the object stays alive and, for a
// bytearray, cannot be resized) until closed.
class Region {
 public:
  Region(std::shared_ptr<dma::TargetThread> thread, const py::object& object, dma::Target::Access access)
      : thread_(std::move(thread)) {
    int flags = PyBUF_C_CONTIGUOUS;
    if (access != dma::Target::Access::read) flags |= PyBUF_WRITABLE;
    if (PyObject_GetBuffer(object.ptr(), &view_, flags) != 0) {
      const bool writable_asked = (flags & PyBUF_WRITABLE) != 0;
      PyErr_Clear();
      // Tell read-only from non-contiguous: ask again for the weaker one.
      Py_buffer probe;
      if (writable_asked && PyObject_GetBuffer(object.ptr(), &probe, PyBUF_C_CONTIGUOUS) == 0) {
        PyBuffer_Release(&probe);
        throw py::type_error("the buffer is read-only: the server must write into it");
      }
      PyErr_Clear();
      if (PyObject_GetBuffer(object.ptr(), &probe, PyBUF_STRIDES) == 0) {
        PyBuffer_Release(&probe);
        throw py::type_error("the buffer is not C-contiguous: expose a contiguous array (numpy.ascontiguousarray)");
      }
      PyErr_Clear();
      throw py::type_error("the object does not support the buffer protocol");
    }
    held_ = true;
    if (view_.len == 0) {
      close();
      throw py::value_error("the buffer is empty: nothing to expose");
    }
    try {
      py::gil_scoped_release unlocked;
      region_ = thread_->expose({static_cast<std::byte*>(view_.buf), static_cast<std::size_t>(view_.len)}, access);
    } catch (const std::system_error& e) {
      close();
      raise_error(std::string("exposing the buffer: ") + e.what(), e.code());
    }
  }
  ~Region() { close(); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  void close() {
    region_ = {};
    if (held_) PyBuffer_Release(&view_);
    held_ = false;
  }
  bool closed() const { return !held_; }
  const dma::Advertisement& advertisement() const {
    if (!held_) throw py::value_error("the region is closed");
    return region_.advertisement();
  }
  std::size_t length() const { return held_ ? static_cast<std::size_t>(view_.len) : 0; }
  std::span<const std::byte> bytes() const {
    if (!held_) throw py::value_error("the region is closed");
    return {static_cast<const std::byte*>(view_.buf), static_cast<std::size_t>(view_.len)};
  }
  // The exposed bytes as a memoryview (writable when the export is), valid while the region is
  // open: the caller keeps the region open while it uses the view.
  py::memoryview memory() const {
    if (!held_) throw py::value_error("the region is closed");
    return py::memoryview::from_memory(view_.buf, view_.len, view_.readonly != 0);
  }

 private:
  std::shared_ptr<dma::TargetThread> thread_;
  Py_buffer view_{};
  bool held_ = false;
  dma::Target::Region region_;
};

class Target {
 public:
  Target(std::optional<std::string> config_path, std::optional<std::string> toml_text) {
    dma::Configuration configuration;
    std::error_code ec;
    std::string detail;
    if (config_path) {
      configuration = dma::Configuration::from_toml(*config_path, dma::Configuration::default_section, ec, detail);
    } else if (toml_text) {
      configuration = dma::Configuration::from_toml_string(*toml_text, dma::Configuration::default_section,
                                                           "keyword configuration", ec, detail);
    }
    if (ec) raise_error("configuration: " + detail, ec);
    std::unique_ptr<dma::TargetThread> started;
    {
      py::gil_scoped_release unlocked;
      started = dma::TargetThread::start(configuration, {}, ec, &detail);
    }
    if (!started) raise_error("opening the target: " + (detail.empty() ? ec.message() : detail), ec);
    thread_ = std::move(started);
  }

  std::shared_ptr<Region> expose(const py::object& object, std::string_view access) {
    return std::make_shared<Region>(open(), object, parse_access(access));
  }
  py::bytes address() { return as_bytes(open()->target().local_address()); }
  std::string address_hex() { return dma::encode_hex(open()->target().local_address()); }
  // The next write notification (immediate data), or None after `timeout` seconds (None: no
  // limit). Waits with the GIL released, checking for signals (Ctrl-C) ten times a second.
  py::object next_notification(std::optional<double> timeout) {
    const auto thread = open();
    auto& target = thread->target();
    struct Wait {
      std::promise<std::pair<std::error_code, dma::WriteNotification>> promise;
      asio::cancellation_signal cancel;
    };
    auto wait = std::make_shared<Wait>();
    auto future = wait->promise.get_future();
    asio::post(target.get_executor(), [wait, &target] {
      target.async_wait_written(
          asio::bind_cancellation_slot(wait->cancel.slot(), [wait](std::error_code ec, dma::WriteNotification n) {
            wait->promise.set_value({ec, n});
          }));
    });
    const auto until = timeout ? std::chrono::steady_clock::now() + std::chrono::duration<double>(*timeout)
                               : std::chrono::steady_clock::time_point::max();
    bool cancelled = false;
    for (;;) {
      std::future_status status;
      {
        py::gil_scoped_release unlocked;
        status = future.wait_for(std::chrono::milliseconds(100));
      }
      if (status == std::future_status::ready) break;
      const bool interrupted = PyErr_CheckSignals() != 0;
      if (!cancelled && (interrupted || std::chrono::steady_clock::now() >= until)) {
        asio::post(target.get_executor(), [wait] { wait->cancel.emit(asio::cancellation_type::terminal); });
        cancelled = true;
      }
      if (interrupted) {
        py::gil_scoped_release unlocked;
        future.wait();  // the wait ends (cancelled, or a notification that came first and is lost)
        throw py::error_already_set();
      }
    }
    const auto [ec, notification] = future.get();
    if (ec == asio::error::operation_aborted) return py::none();
    if (ec) raise_error("waiting for a notification: " + ec.message(), ec);
    py::dict result;
    result["data"] = notification.data;
    result["length"] = notification.length ? py::object(py::int_(*notification.length)) : py::none();
    return py::object(std::move(result));
  }

  void close() {
    std::shared_ptr<dma::TargetThread> thread = std::move(thread_);
    py::gil_scoped_release unlocked;
    thread.reset();  // regions still open keep it until they close
  }
  bool closed() const { return thread_ == nullptr; }

 private:
  static py::bytes as_bytes(std::span<const std::uint8_t> bytes) {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }
  const std::shared_ptr<dma::TargetThread>& open() const {
    if (!thread_) raise_error("the target is closed", dma::make_error_code(dma::errc::shutdown));
    return thread_;
  }
  std::shared_ptr<dma::TargetThread> thread_;
};

// A reply as redis-py returns it, as the protocol's readers take it. `storage` keeps the texts.
dma::kv::resp::Reply to_reply(const py::handle& value, std::vector<std::string>& storage) {
  dma::kv::resp::Reply reply;
  if (value.is_none()) return reply;
  if (py::isinstance<py::bool_>(value) || py::isinstance<py::int_>(value)) {
    reply.type = dma::kv::resp::Reply::Type::integer;
    reply.integer = value.cast<std::int64_t>();
  } else if (py::isinstance<py::bytes>(value) || py::isinstance<py::str>(value)) {
    storage.push_back(value.cast<std::string>());
    reply.type = dma::kv::resp::Reply::Type::bulk;
    reply.text = storage.back();
  } else if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    reply.type = dma::kv::resp::Reply::Type::array;
    for (const auto& element : value)
      reply.elements.push_back(to_reply(element, storage));
  } else {
    throw py::type_error("a reply is bytes, str, int, a list of those, or None");
  }
  return reply;
}

std::vector<py::bytes> as_arguments(const std::vector<std::string>& arguments) {
  std::vector<py::bytes> out;
  out.reserve(arguments.size());
  for (const auto& argument : arguments)
    out.emplace_back(argument);
  return out;
}

dma::kv::Window window_of(const Region& region, std::uint64_t length) {
  const auto& advertisement = region.advertisement();
  return {advertisement.remote_key, advertisement.remote_address, length};
}

const char* error_kind(dma::kv::ErrorReply kind) {
  using K = dma::kv::ErrorReply;
  switch (kind) {
    case K::no_hello:
      return "no_hello";
    case K::try_again:
      return "try_again";
    case K::cluster_down:
      return "cluster_down";
    case K::out_of_memory:
      return "out_of_memory";
    case K::wrong_type:
      return "wrong_type";
    case K::moved:
      return "moved";
    case K::ask:
      return "ask";
    case K::no_such_key:
      return "no_such_key";
    case K::transfer_failed:
      return "transfer_failed";
    case K::crc_mismatch:
      return "crc_mismatch";
    case K::value_too_large:
      return "value_too_large";
    case K::buffer_too_small:
      return "buffer_too_small";
    case K::other:
      return "other";
  }
  return "other";
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "dma-libfabric's native part: Target, Region and the side channel's protocol";
  m.def("_set_error_class", [](py::object cls) { error_class = std::move(cls); });
  m.attr("version") = std::string(dma::version());

  py::class_<Region, std::shared_ptr<Region>>(m, "Region")
      .def_property_readonly("remote_key", [](const Region& r) { return r.advertisement().remote_key; })
      .def_property_readonly("remote_address", [](const Region& r) { return r.advertisement().remote_address; })
      .def_property_readonly("length", &Region::length)
      .def_property_readonly("advertisement", [](const Region& r) { return r.advertisement().to_string(); })
      .def_property_readonly("closed", &Region::closed)
      .def_property_readonly("memory", &Region::memory)
      .def("close", &Region::close);

  py::class_<Target>(m, "Target")
      .def(py::init<std::optional<std::string>, std::optional<std::string>>(), py::arg("config_path"),
           py::arg("toml_text"))
      .def("expose", &Target::expose, py::arg("buffer"), py::arg("access"))
      .def_property_readonly("address", &Target::address)
      .def_property_readonly("address_hex", &Target::address_hex)
      .def_property_readonly("closed", &Target::closed)
      .def("next_notification", &Target::next_notification, py::arg("timeout"))
      .def("close", &Target::close);

  m.def(
      "checksum",
      [](const py::buffer& buffer, std::size_t length) {
        const py::buffer_info info = buffer.request();
        if (length > static_cast<std::size_t>(info.size * info.itemsize))
          throw py::value_error("length past the buffer");
        const std::span<const std::byte> bytes(static_cast<const std::byte*>(info.ptr), length);
        py::gil_scoped_release unlocked;
        return dma::checksum(bytes);
      },
      py::arg("buffer"), py::arg("length"), "CRC-32C of the buffer's first `length` bytes");
  m.def("hello_arguments", [](const py::bytes& address) {
    const std::string text = address;
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(text.data());
    return as_arguments(dma::kv::hello_arguments({bytes, text.size()}));
  });
  m.def(
      "set_arguments",
      [](const std::string& key, const Region& region, std::uint64_t length, std::optional<std::uint32_t> crc,
         const std::string& client) {
        return as_arguments(dma::kv::set_arguments(key, window_of(region, length), crc, client));
      },
      py::arg("key"), py::arg("region"), py::arg("length"), py::arg("crc"), py::arg("client"));
  m.def(
      "get_arguments",
      [](const std::string& key, const Region& region, std::uint64_t capacity, std::optional<std::uint32_t> token,
         const std::string& client) {
        return as_arguments(dma::kv::get_arguments(key, window_of(region, capacity), token, client));
      },
      py::arg("key"), py::arg("region"), py::arg("capacity"), py::arg("token"), py::arg("client"));
  m.def("read_hello_reply", [](const py::object& value) {
    std::vector<std::string> storage;
    storage.reserve(16);
    const auto read = dma::kv::read_hello_reply(to_reply(value, storage));
    if (!read.error.empty()) raise_error("DMA.HELLO: " + read.error);
    py::dict reply;
    reply["server_address_hex"] = read.reply.server_address_hex;
    reply["client_id"] = read.reply.client_id;
    reply["max_value"] = read.reply.max_value;
    reply["confirmation"] = std::string(dma::kv::to_string(read.reply.confirmation));
    reply["token"] = read.reply.token;
    return reply;
  });
  m.def("read_get_reply", [](const py::object& value) {
    std::vector<std::string> storage;
    storage.reserve(16);
    const auto read = dma::kv::read_get_reply(to_reply(value, storage));
    if (!read.error.empty()) raise_error("DMA.GET: " + read.error);
    return py::make_tuple(read.length, read.crc);
  });
  m.def("classify_error", [](const std::string& text) { return error_kind(dma::kv::classify_error(text)); });
}
