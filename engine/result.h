// Value-or-error results. No exceptions cross a library boundary; an operating error is a
// returned value that says what was wrong and what was expected.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "engine/check.h"

namespace twinstep {

// A typed error: a small per-subsystem code enum plus a human message.
template <class Code>
struct Error {
  Code code;
  std::string message;
};

template <class E>
struct Unexpected {
  E error;
};

template <class E>
Unexpected<std::decay_t<E>> unexpected(E&& error) {
  return {std::forward<E>(error)};
}

template <class T, class E>
class [[nodiscard]] Result {
 public:
  Result(T value) : storage_(std::in_place_index<0>, std::move(value)) {}
  template <class F>
  Result(Unexpected<F> error) : storage_(std::in_place_index<1>, E(std::move(error.error))) {}

  bool ok() const { return storage_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    TS_CHECK(ok()) << "value() on an error result";
    return std::get<0>(storage_);
  }
  const T& value() const& {
    TS_CHECK(ok()) << "value() on an error result";
    return std::get<0>(storage_);
  }
  T&& value() && {
    TS_CHECK(ok()) << "value() on an error result";
    return std::get<0>(std::move(storage_));
  }
  const E& error() const {
    TS_CHECK(!ok()) << "error() on an ok result";
    return std::get<1>(storage_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, E> storage_;
};

struct Ok {};
// A result with no value.
template <class E>
using Status = Result<Ok, E>;

}  // namespace twinstep

namespace twinstep::engine {
using ::twinstep::Ok;
using ::twinstep::Result;
using ::twinstep::Status;
using ::twinstep::unexpected;
}  // namespace twinstep::engine
