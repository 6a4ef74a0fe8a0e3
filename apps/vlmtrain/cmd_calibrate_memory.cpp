// vlmtrain calibrate-memory: fit the memory model's device corrections from a finished run's
// metrics.jsonl and write (or merge) them into a calibration file (docs/memory-device.md).
#include <ctime>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "core/memory_calibration_file.h"
#include "core/memory_records.h"
#include "core/strings.h"
#include "core/units.h"
#include "core/utc_time.h"
#include "memory/calibration.h"

namespace vlm::app {
namespace {

namespace fs = std::filesystem;

struct CalibrateArgs {
  std::string run_dir;
  std::string out;
};

std::string bytes_text(int64_t bytes) {
  return std::to_string(bytes) + " bytes (" + format_bytes(bytes) + ")";
}

void print_fit(const memory::CalibrationFit& fit, const MemoryRecords& records) {
  const CalibrationEntry& e = fit.entry;
  const RunRecord& run = records.runs.front();
  std::cout << "calibrate-memory: " << records.file << ": device " << e.device << ", LibTorch "
            << e.torch << " (" << run.torch_version << "), " << run.world_size << " rank"
            << (run.world_size == 1 ? "" : "s") << "\n";
  std::cout << "  steps used        " << fit.steps_used;
  if (fit.steps_excluded > 0) {
    std::cout << " (" << fit.steps_excluded << " redone after an OOM left out)";
  }
  std::cout << "\n  activation_scale  " << e.activation_scale
            << (fit.scale_fitted ? "" : " (every step predicted the same bytes: offset only)")
            << "\n  allocated_offset  " << bytes_text(e.allocated_offset_bytes) << "\n";
  if (e.device != "cpu") {
    std::cout << "  fragmentation     "
              << (e.fragmentation ? std::to_string(*e.fragmentation) : "not fitted") << "\n";
    std::cout << "  cuda_context      "
              << (e.cuda_context_bytes ? bytes_text(*e.cuda_context_bytes) : "not fitted") << "\n";
  }
  std::cout << "  residuals         max " << bytes_text(fit.residual_max_bytes) << ", median "
            << bytes_text(fit.residual_median_bytes) << "\n";
  if (!fit.unfitted.empty()) {
    std::cout << "  not fitted (the run measured nothing for them): " << join(fit.unfitted, ", ")
              << "\n";
  }
}

int run_calibrate_memory(const CalibrateArgs& args) {
  const fs::path metrics = fs::path(args.run_dir) / "metrics.jsonl";
  std::error_code ec;
  if (!fs::is_directory(args.run_dir, ec)) {
    throw UsageError("--run " + args.run_dir + ": not a directory (a run's output.dir)");
  }
  if (!fs::is_regular_file(metrics, ec)) {
    throw UsageError("--run " + args.run_dir + ": no metrics.jsonl in it (a run's output.dir)");
  }
  const MemoryRecords records = read_memory_records(metrics);
  const memory::CalibrationFit fit =
      memory::fit_calibration(records, args.run_dir, utc_now("%Y-%m-%d"));
  print_fit(fit, records);
  if (args.out.empty()) {
    std::cout << "(no --out: nothing written)\n";
    return 0;
  }
  // A fit from impossible measurements is refused by the file's own reader: say so here, naming
  // the run, rather than write what every train and estimate would then refuse.
  try {
    check_calibration_file(CalibrationFile{{fit.entry}}, args.out);
  } catch (const ConfigError& refused) {
    throw DataError("the run's measurements give a calibration that cannot be used (" +
                        refused.message() + "): nothing written to " + args.out,
                    SourceLocation{metrics.string()});
  }
  // An existing file is read strictly first: a malformed one is reported, never overwritten.
  CalibrationFile file;
  if (fs::exists(args.out, ec)) file = read_calibration_file(args.out);
  const bool replaced = file.merge(fit.entry);
  write_calibration_file(args.out, file);
  std::cout << "wrote " << args.out << " (" << (replaced ? "replaced" : "added")
            << " the entry for " << fit.entry.device << " / LibTorch " << fit.entry.torch << "; "
            << file.entries.size() << " entr" << (file.entries.size() == 1 ? "y" : "ies") << ")\n";
  return 0;
}

}  // namespace

Command add_calibrate_memory_command(CLI::App& root, const GlobalOptions&) {
  auto args = std::make_shared<CalibrateArgs>();
  CLI::App* cmd = root.add_subcommand(
      "calibrate-memory",
      "Fit the memory model's device corrections from a finished run (docs/memory-device.md)");
  cmd->add_option("--run", args->run_dir, "The run's directory (its output.dir)")->required();
  cmd->add_option("--out", args->out,
                  "Calibration file to write, or to merge into (the entry for the same device "
                  "and LibTorch is replaced); without it the fit is only printed");
  return {cmd, [args] { return run_calibrate_memory(*args); }};
}

}  // namespace vlm::app
