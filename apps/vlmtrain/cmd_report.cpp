// vlmtrain report: a run's curves, memory and batches as one self-contained HTML file, or as
// text for a terminal (docs/report.md).
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "core/error.h"
#include "core/utc_time.h"
#include "report/html_report.h"
#include "report/run_data.h"
#include "report/text_report.h"

namespace vlm::app {
namespace {

namespace fs = std::filesystem;

struct ReportArgs {
  std::vector<std::string> run_dirs;
  std::string out;
  bool text = false;
};

// Written beside its place and renamed over it: a reader never sees half a page.
void write_page(const fs::path& path, const std::string& html) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << html;
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw Error(ExitCode::kSaveFailed, "cannot write the report " + path.string());
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error(ExitCode::kSaveFailed,
                "cannot write the report " + path.string() + ": " + ec.message());
  }
}

int run_report(const ReportArgs& args, const GlobalOptions& global) {
  std::vector<report::RunData> runs;
  for (const auto& dir : args.run_dirs) runs.push_back(report::read_run(dir));
  if (args.text) {
    const bool color =
        !global.no_color && std::getenv("NO_COLOR") == nullptr && isatty(STDOUT_FILENO) == 1;
    std::cout << report::text_report(runs, color) << std::flush;
    if (args.out.empty()) return 0;
  }
  const fs::path out = !args.out.empty()           ? fs::path(args.out)
                       : args.run_dirs.size() == 1 ? fs::path(args.run_dirs[0]) / "report.html"
                                                   : fs::path("report.html");
  write_page(out, report::html_report(runs, utc_now("%Y-%m-%d %H:%M UTC")));
  int64_t steps = 0;
  for (const auto& run : runs) steps += static_cast<int64_t>(run.steps.size());
  std::cout << "report: " << out.string() << " (" << runs.size() << " run"
            << (runs.size() == 1 ? "" : "s") << ", " << steps << " steps)\n";
  return 0;
}

}  // namespace

Command add_report_command(CLI::App& root, const GlobalOptions& global) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* app = root.add_subcommand(
      "report", "A run's curves, memory and batches: one self-contained HTML file, or text");
  app->add_option("run_dirs", args->run_dirs,
                  "Run directories (output.dir); several are overlaid, one colour each")
      ->required();
  app->add_option("--out", args->out,
                  "The HTML file (default RUN_DIR/report.html; ./report.html for several runs)");
  app->add_flag("--text", args->text,
                "Print the headline figures and small charts instead (no HTML unless --out)");
  return {app, [args, &global] { return run_report(*args, global); }};
}

}  // namespace vlm::app
