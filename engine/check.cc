// The check-failure handler behind TS_CHECK.
#include "engine/check.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace twinstep {
namespace {

std::mutex& handler_mutex() {
  static std::mutex mutex;
  return mutex;
}

CheckHandler& handler_slot() {
  static CheckHandler handler;
  return handler;
}

}  // namespace

CheckHandler set_check_handler(CheckHandler handler) {
  std::lock_guard lock(handler_mutex());
  CheckHandler previous = std::move(handler_slot());
  handler_slot() = std::move(handler);
  return previous;
}

CheckMessage::CheckMessage(const char* file, int line, const char* condition) {
  stream_ << file << ":" << line << ": check failed: " << condition << " ";
}

CheckMessage::~CheckMessage() noexcept(false) {
  CheckHandler handler;
  {
    std::lock_guard lock(handler_mutex());
    handler = handler_slot();
  }
  const std::string message = stream_.str();
  if (handler) handler(message);  // may throw in tests
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace twinstep
