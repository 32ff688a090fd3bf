// A blocking bounded FIFO between one pipeline stage and the next (q_pre after the prefetcher, q_hs on
// the drafter). Closing it wakes both sides for a clean shutdown; failing it hands a producer's exception
// to the consumer, which rethrows it on its next pop instead of waiting forever.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>

#include "core/error.h"

namespace df {

template <class T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity) {
    DF_CHECK(capacity > 0, "queue capacity must be at least 1 (check the queue-depth setting)");
  }
  BoundedQueue(const BoundedQueue&) = delete;
  BoundedQueue& operator=(const BoundedQueue&) = delete;

  // Blocks while full. Returns false (dropping the item) once the queue is closed or failed.
  bool push(T item) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [&] { return closed_ || items_.size() < capacity_; });
    if (closed_) return false;
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return true;
  }

  // Blocks while empty. Returns nullopt when closed and drained; rethrows the producer's exception if failed.
  std::optional<T> pop() {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return closed_ || !items_.empty(); });
    return take_locked();
  }

  // Like pop() but never blocks: nullopt when nothing is ready right now.
  std::optional<T> try_pop() {
    std::unique_lock<std::mutex> lock(mu_);
    if (items_.empty() && !closed_) return std::nullopt;
    return take_locked();
  }

  // No more pushes; items already queued can still be popped.
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_full_.notify_all();
    not_empty_.notify_all();
  }

  // Closes the queue and makes every later pop rethrow `error` (queued items are dropped: the stage failed).
  void fail(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(error);
    items_.clear();
    closed_ = true;
    not_full_.notify_all();
    not_empty_.notify_all();
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return items_.size();
  }
  size_t capacity() const { return capacity_; }
  bool closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

 private:
  std::optional<T> take_locked() {
    if (error_) std::rethrow_exception(error_);
    if (items_.empty()) return std::nullopt;
    std::optional<T> out(std::move(items_.front()));
    items_.pop_front();
    not_full_.notify_one();
    return out;
  }

  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable not_full_, not_empty_;
  std::deque<T> items_;
  bool closed_ = false;
  std::exception_ptr error_;
};

}  // namespace df
