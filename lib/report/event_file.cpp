#include "report/event_file.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/build_version.h"
#include "core/error.h"
#include "report/tensorboard_event.pb.h"

namespace vlm::report {
namespace {

namespace tb = tensorboard;

const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return value;
}

// The host in a file name: no '/' (core/build_version.h's host_name, or "host").
std::string file_host_name() {
  std::string name = host_name();
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return name.empty() ? "host" : name;
}

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path, int error) {
  throw Error(ExitCode::kSaveFailed, "cannot " + what + " the TensorBoard event file " +
                                         path.string() + ": " + std::strerror(error));
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto& table = crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string frame_record(const std::string& payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  put_le(out, payload.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out += payload;
  put_le(out, masked_crc32c(payload.data(), payload.size()), 4);
  return out;
}

EventFileWriter::EventFileWriter(const std::filesystem::path& dir, double wall_time) {
  std::ostringstream name;
  name << "events.out.tfevents." << static_cast<int64_t>(wall_time) << '.' << file_host_name()
       << '.' << getpid() << ".vlmtrain";
  path_ = dir / name.str();
  out_ = std::fopen(path_.c_str(), "wb");
  if (out_ == nullptr) fail("create", path_, errno);
  tb::Event event;
  event.set_wall_time(wall_time);
  event.set_file_version("brain.Event:2");
  append(event.SerializeAsString());
}

EventFileWriter::~EventFileWriter() {
  if (out_ != nullptr) std::fclose(out_);
}

void EventFileWriter::write_scalars(int64_t step, double wall_time,
                                    const std::vector<Scalar>& scalars) {
  if (scalars.empty()) return;
  tb::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tb::Summary* summary = event.mutable_summary();
  for (const Scalar& s : scalars) {
    tb::SummaryValue* value = summary->add_value();
    value->set_tag(s.tag);
    value->set_simple_value(static_cast<float>(s.value));
  }
  append(event.SerializeAsString());
}

void EventFileWriter::write_session_start(int64_t step, double wall_time) {
  tb::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  event.mutable_session_log()->set_status(tb::SessionLog::START);
  append(event.SerializeAsString());
}

void EventFileWriter::append(const std::string& payload) {
  const std::string record = frame_record(payload);
  if (std::fwrite(record.data(), 1, record.size(), out_) != record.size() ||
      std::fflush(out_) != 0) {
    fail("write", path_, errno);
  }
}

bool EventFileWriter::is_own_file_name(const std::string& name) {
  const std::string prefix = "events.out.tfevents.", suffix = ".vlmtrain";
  return name.size() > prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> read_records(const std::filesystem::path& file, bool* torn) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError("cannot open the event file " + file.string());
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> payloads;
  if (torn) *torn = false;
  size_t at = 0;
  const auto damaged = [&](const std::string& what) {
    return DataError("event file " + file.string() + ": the record at byte " + std::to_string(at) +
                     " " + what);
  };
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) {
      if (torn) *torn = true;
      break;
    }
    const uint64_t length = get_le(bytes.data() + at, 8);
    if (get_le(bytes.data() + at + 8, 4) != masked_crc32c(bytes.data() + at, 8)) {
      throw damaged("has a length that fails its CRC");
    }
    if (length > bytes.size() - at - 12 || bytes.size() - at - 12 - length < 4) {
      if (torn) *torn = true;
      break;
    }
    const char* payload = bytes.data() + at + 12;
    if (get_le(payload + length, 4) != masked_crc32c(payload, length)) {
      throw damaged("has a payload that fails its CRC");
    }
    payloads.emplace_back(payload, length);
    at += 16 + length;
  }
  return payloads;
}

std::vector<ReadEvent> read_events(const std::filesystem::path& file) {
  std::vector<ReadEvent> events;
  for (const std::string& payload : read_records(file)) {
    tb::Event event;
    if (!event.ParseFromString(payload)) {
      throw DataError("event file " + file.string() + ": a record that is not an Event message");
    }
    ReadEvent e;
    e.step = event.step();
    e.wall_time = event.wall_time();
    e.session_start =
        event.has_session_log() && event.session_log().status() == tb::SessionLog::START;
    for (const auto& value : event.summary().value())
      e.scalars.push_back({value.tag(), value.simple_value()});
    events.push_back(std::move(e));
  }
  return events;
}

}  // namespace vlm::report
