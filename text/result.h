// text/: value-or-error results and always-on assertions of its own. text/ depends on nothing
// of engine/ (DESIGN.md §2), so it cannot use engine/result.h; the shape is the same.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

// A programmer error: prints the condition and where, then aborts (always on).
#define TX_CHECK(condition)                                                              \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace twinstep::text {

// A typed error: a small per-subsystem code enum plus a message that names what was wrong.
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
    TX_CHECK(ok());
    return std::get<0>(storage_);
  }
  const T& value() const& {
    TX_CHECK(ok());
    return std::get<0>(storage_);
  }
  T&& value() && {
    TX_CHECK(ok());
    return std::get<0>(std::move(storage_));
  }
  const E& error() const {
    TX_CHECK(!ok());
    return std::get<1>(storage_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, E> storage_;
};

}  // namespace twinstep::text
