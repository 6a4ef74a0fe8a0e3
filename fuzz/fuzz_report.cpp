// A run's metrics.jsonl as `vlmtrain report` reads and draws it: read_run, then both reports
// (report/). Whatever the file holds, reading and drawing end, without a crash; the page is a
// whole HTML document.
#include <filesystem>
#include <string>

#include "fuzz_support.h"
#include "report/html_report.h"
#include "report/run_data.h"
#include "report/text_report.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vlm::fuzz::guard("report", [&] {
    const std::string path = vlm::fuzz::write_scratch("metrics.jsonl", data, size);
    const auto run = vlm::report::read_run(std::filesystem::path(path).parent_path());
    const std::string html = vlm::report::html_report({run}, "now");
    if (html.rfind("<!doctype html>", 0) != 0 || html.find("</html>") == std::string::npos) {
      vlm::fuzz::invariant_failed("report", "the page is not a whole document");
    }
    vlm::report::text_report({run}, true);
  });
  return 0;
}
