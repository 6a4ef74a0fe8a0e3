// Says, once per run, that training waits for its data: a GPU fed by too few decoding threads
// (data.workers) trains at the loader's pace, and nothing else in the log says so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace vlm::train {

class DataWaitWatch {
 public:
  static constexpr int64_t kSkipSteps = 2;  // a process's first steps include its start-up
  static constexpr int64_t kWindowSteps = 10;
  static constexpr double kWaitShare = 0.10;  // of the window's step time

  // `workers`: data.workers; `cpus`: the CPUs this rank may use (the advice names both).
  DataWaitWatch(int64_t workers, int64_t cpus) : workers_(workers), cpus_(cpus) {}

  // After each step of this process: its time (the wait included) and its wait for data. The
  // warning to give, once: when a window of kWindowSteps steps after the first kSkipSteps
  // waited more than kWaitShare of its time.
  std::optional<std::string> step_done(int64_t step, double step_ms, double wait_ms);

 private:
  int64_t workers_, cpus_;
  int64_t seen_ = 0, window_first_step_ = 0, in_window_ = 0;
  double window_ms_ = 0, window_wait_ms_ = 0;
  bool warned_ = false;
};

}  // namespace vlm::train
