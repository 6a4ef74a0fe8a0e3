// Progress output of a run. On a terminal (rank 0): one line redrawn in place,
//   [#########.....................] 90/300 | loss 2.1034 | 4012 tok/s | 198.3 MiB | ETA 02:21
// Otherwise: one plain log line every log.every_steps steps (and after the first step).
// Any other log line must first end the bar's line (end_line), or it would be drawn over.
#pragma once

#include <cstdint>

#include "train/metrics.h"

namespace vlm::train {

class ProgressOutput {
 public:
  ProgressOutput(bool interactive, int64_t max_steps, int64_t every_steps, int64_t first_step);

  // After step m.step; `elapsed_s` since the run (this process) started.
  void step_done(const StepMetrics& m, double elapsed_s);
  // Ends an open progress line, so that the next log line starts on its own.
  void end_line();

 private:
  void draw_bar(const StepMetrics& m, double elapsed_s);
  void log_line(const StepMetrics& m) const;

  bool interactive_;
  int64_t max_steps_;
  int64_t every_steps_;
  int64_t first_step_;
  bool line_open_ = false;
};

}  // namespace vlm::train
