// A fixed pool of worker threads running submitted tasks in FIFO order.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace vlm {

class ThreadPool {
 public:
  // threads == 0: submit() runs the task inline, on the caller's thread.
  explicit ThreadPool(size_t threads);
  ~ThreadPool();  // finishes the queued tasks, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  template <class F>
  std::future<std::invoke_result_t<F>> submit(F task) {
    using R = std::invoke_result_t<F>;
    auto packaged = std::make_shared<std::packaged_task<R()>>(std::move(task));
    std::future<R> result = packaged->get_future();
    if (threads_.empty()) {
      (*packaged)();
      return result;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.emplace_back([packaged] { (*packaged)(); });
    }
    wake_.notify_one();
    return result;
  }

  size_t size() const { return threads_.size(); }

 private:
  void work();

  std::vector<std::thread> threads_;
  std::deque<std::function<void()>> tasks_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
};

}  // namespace vlm
