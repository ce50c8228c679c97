#include "bench/support/result_reporter.h"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <sstream>

namespace cofab::bench {
namespace {

// Console output for people, plus a copy of every finished case for RESULT lines.
class CollectingReporter : public benchmark::ConsoleReporter {
 public:
  // No colours: escape codes would otherwise precede the RESULT lines printed after the run.
  explicit CollectingReporter(std::vector<CaseResult>* out)
      : ConsoleReporter(OO_Tabular), out_(out) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      CaseResult c;
      c.name = run.benchmark_name();
      c.iterations = run.iterations;
      double scale = 1e9 / benchmark::GetTimeUnitMultiplier(run.time_unit);
      c.realTimeNs = run.GetAdjustedRealTime() * scale;
      c.cpuTimeNs = run.GetAdjustedCPUTime() * scale;
      // Counters arrive already finished (rates divided by time, averages taken).
      for (const auto& [key, counter] : run.counters) c.counters[key] = counter.value;
      out_->push_back(std::move(c));
    }
  }

 private:
  std::vector<CaseResult>* out_;
};

}  // namespace

std::vector<CaseResult> runBenchmarks(int* argc, char** argv) {
  std::vector<CaseResult> cases;
  benchmark::Initialize(argc, argv);
  CollectingReporter reporter(&cases);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return cases;
}

const CaseResult* findCase(const std::vector<CaseResult>& cases, const std::string& prefix) {
  for (const auto& c : cases) {
    if (c.name.rfind(prefix, 0) == 0) return &c;
  }
  return nullptr;
}

void printResult(const std::string& bench,
                 const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string line = "RESULT " + bench;
  for (const auto& [k, v] : fields) line += " " + k + "=" + v;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string num(double value, int digits) {
  std::ostringstream os;
  os.precision(digits);
  os << value;
  return os.str();
}

}  // namespace cofab::bench
