// Per-request KV state of one family, and the frontier account that says which pages a
// request must hold at a given frontier (DESIGN.md §2.2).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/ids.h"
#include "engine/mutants.h"

namespace twinstep::engine {

// Where the last plan listed one family's pages of a request (Scheduler::build_plan keeps the
// page tables of the plan it built last and rewrites only the seqs whose list changed).
struct PlanListing {
  uint64_t step = UINT64_MAX;  // step_index of that plan; UINT64_MAX: never listed
  int32_t seq = -1;            // the seq's index in that plan
  uint32_t rewrites = 0;       // KvState::rewrites when it was listed
  int32_t held = 0;            // how many of the listed pages were held then (the first ones)
};

// One edit of a request's page list, as PageList records it: `page` entered (+1) or left (-1)
// the list of `request`'s `family`.
struct PageListEdit {
  RequestId request;
  PageId page;
  Family family = Family::kGlobal;
  int8_t delta = 0;
};
// Where bound page lists record their edits and bound request fields their writes (the
// scheduler owns one; a checker drains it).
struct PageListLog {
  std::vector<PageListEdit> edits;
  std::vector<RequestId> marked;  // a request per write of one of its Marked fields (repeats)
};

// One edit of a scheduler queue, as RequestQueue (engine/scheduler.h) records it: `request`
// entered (+1) or left (-1) the running (queue 0) or waiting (queue 1) queue.
struct QueueEdit {
  RequestId request;
  uint8_t queue = 0;
  int8_t delta = 0;
};

// What a request's Marked fields write to: its log and id (bound once it has its place).
struct RequestMarker {
  PageListLog* log = nullptr;
  RequestId id;
  void mark() const {
    if (log != nullptr) log->marked.push_back(id);
  }
};

// A request's field read as the plain value and written only through assignment, each write
// marking the request in its marker's log, so a checker re-checks just the marked requests
// and no write escapes it. A copy is unbound (it belongs to no request).
template <class T>
class Marked {
 public:
  Marked() = default;
  Marked(T value) : value_(value) {}  // NOLINT: implicit, a field initialised as its value
  Marked(const Marked& other) : value_(other.value_) {}
  Marked& operator=(const Marked& other) { return *this = other.value_; }
  Marked& operator=(T value) {
    value_ = value;
    if (marker_ != nullptr) marker_->mark();
    return *this;
  }
  Marked& operator+=(T delta) { return *this = static_cast<T>(value_ + delta); }
  operator T() const { return value_; }  // NOLINT: read as the value
  T get() const { return value_; }
  void bind(const RequestMarker* marker) { marker_ = marker; }

 private:
  T value_{};
  const RequestMarker* marker_ = nullptr;
};

// The same for a vector a request only appends to or replaces wholesale.
template <class T>
class MarkedVector {
 public:
  MarkedVector() = default;
  MarkedVector(std::vector<T> values) : values_(std::move(values)) {}  // NOLINT
  MarkedVector(const MarkedVector& other) : values_(other.values_) {}
  MarkedVector& operator=(const MarkedVector& other) { return *this = other.values_; }
  MarkedVector& operator=(std::vector<T> values) {
    values_ = std::move(values);
    if (marker_ != nullptr) marker_->mark();
    return *this;
  }
  void push_back(T value) {
    values_.push_back(value);
    if (marker_ != nullptr) marker_->mark();
  }
  operator const std::vector<T>&() const { return values_; }  // NOLINT: read as the vector
  const std::vector<T>& view() const { return values_; }
  size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }
  const T& operator[](size_t i) const { return values_[i]; }
  const T& back() const { return values_.back(); }
  const T* data() const { return values_.data(); }
  typename std::vector<T>::const_iterator begin() const { return values_.begin(); }
  typename std::vector<T>::const_iterator end() const { return values_.end(); }
  void bind(const RequestMarker* marker) { marker_ = marker; }

 private:
  std::vector<T> values_;
  const RequestMarker* marker_ = nullptr;
};

// A request's held pages of one family: a vector whose every edit, once bound to a log, is
// recorded there as pages entering and leaving, including a wholesale assignment and the
// list's destruction (a request erased while holding pages). The entries are read as a
// vector's; they are written only through the calls below, so no edit escapes the log.
class PageList {
 public:
  PageList() = default;
  PageList(const PageList& other) : pages_(other.pages_) {}  // a copy is unbound
  PageList(PageList&& other) noexcept : pages_(std::move(other.pages_)) { other.pages_.clear(); }
  PageList& operator=(const PageList& other) {
    if (this != &other) assign(other.pages_);
    return *this;
  }
  PageList& operator=(PageList&& other) {
    if (this != &other) assign(std::move(other.pages_));
    other.pages_.clear();
    return *this;
  }
  ~PageList() { log_all(-1); }

  // Records every later edit in `log` as `request`'s list of `family`.
  void bind(PageListLog* log, RequestId request, Family family) {
    log_ = log;
    request_ = request;
    family_ = family;
    log_all(+1);
  }

  size_t size() const { return pages_.size(); }
  bool empty() const { return pages_.empty(); }
  const PageId& operator[](size_t i) const { return pages_[i]; }
  const PageId& front() const { return pages_.front(); }
  std::vector<PageId>::const_iterator begin() const { return pages_.begin(); }
  std::vector<PageId>::const_iterator end() const { return pages_.end(); }
  const std::vector<PageId>& view() const { return pages_; }
  operator const std::vector<PageId>&() const { return pages_; }  // NOLINT: read as the vector

  void push_back(PageId page) {
    pages_.push_back(page);
    note(page, +1);
  }
  void append(const std::vector<PageId>& pages) {
    for (const PageId page : pages) push_back(page);
  }
  void pop_front() {
    note(pages_.front(), -1);
    pages_.erase(pages_.begin());
  }
  void set(size_t i, PageId page) {
    note(pages_[i], -1);
    pages_[i] = page;
    note(page, +1);
  }
  void clear() {
    log_all(-1);
    pages_.clear();
  }
  void assign(std::vector<PageId> pages) {
    log_all(-1);
    pages_ = std::move(pages);
    log_all(+1);
  }

 private:
  void note(PageId page, int8_t delta) {
    if (log_ != nullptr) log_->edits.push_back(PageListEdit{request_, page, family_, delta});
  }
  void log_all(int8_t delta) {
    if (log_ == nullptr) return;
    for (const PageId page : pages_) note(page, delta);
  }

  std::vector<PageId> pages_;
  PageListLog* log_ = nullptr;
  RequestId request_;
  Family family_ = Family::kGlobal;
};

struct KvState {
  Marked<int32_t> first_page = 0;  // logical page number (position / page_size) of pages[0]
  PageList pages;                  // held pages, logical order, contiguous from first_page
  // Bumped by every edit of `pages` other than appending at the end and dropping from the
  // front (a page swapped for a shared one, the list cleared or replaced): build_plan keeps
  // the entries of a table it listed before only while this count is unchanged.
  uint32_t rewrites = 0;
  PlanListing listed;
  int32_t end_page() const { return first_page + static_cast<int32_t>(pages.size()); }
};

inline int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

// Logical pages [begin, end) a family must hold at frontier `frontier` (tokens written).
struct PageSpan {
  int32_t begin = 0;
  int32_t end = 0;
  int32_t count() const { return end > begin ? end - begin : 0; }
};

// Global: every page up to the frontier.
inline PageSpan global_span(int32_t frontier, int32_t page_size) {
  return {0, ceil_div(frontier, page_size)};
}

// Local: only pages that intersect the window of the NEXT token (position `frontier`), i.e.
// positions [frontier - window + 1, frontier].
inline PageSpan local_span(int32_t frontier, int32_t page_size, int32_t window) {
  const int32_t first_visible = frontier - window + 1 > 0 ? frontier - window + 1 : 0;
  const int32_t end = ceil_div(frontier, page_size);
  int32_t begin = first_visible / page_size;
  if (TS_MUTANT(kLocalSpanKeepsPage) && begin > 0) begin -= 1;
  return {begin < end ? begin : end, end};
}

// The prefix cache's key of a full page (DESIGN.md §2.7): a chain over every token up to the
// page's end, so equal tokens after different prefixes get different keys. `parent` is the
// previous page's key (0 for page 0). A 64-bit mix per token (splitmix64's finaliser).
inline uint64_t mix_key(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline uint64_t page_key(uint64_t parent, const int32_t* tokens, int32_t count) {
  uint64_t h = mix_key(parent ^ 0x70726566'69780001ULL);
  for (int32_t i = 0; i < count; ++i) {
    h = mix_key(h + static_cast<uint32_t>(tokens[i]) + 0x9e3779b97f4a7c15ULL);
  }
  return h;
}

inline PageSpan family_span(Family family, int32_t frontier, int32_t page_size, int32_t window) {
  return family == Family::kGlobal ? global_span(frontier, page_size)
                                   : local_span(frontier, page_size, window);
}

}  // namespace twinstep::engine
