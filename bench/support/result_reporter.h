// Runs Google Benchmark suites and turns their figures into RESULT lines (DESIGN.md §7):
//
//   RESULT <bench> key=value key=value ...
//
// A bench binary's main() calls runBenchmarks(), then composes RESULT lines from the collected
// cases (often several cases per line: cofab next to the peer it is compared against).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cofab::bench {

struct CaseResult {
  std::string name;        // "BM_TcpStoreGet/threads:4"
  // Wall time per iteration. With ->Threads(n) Google Benchmark counts the iterations of all
  // threads, so this is the inverse of the total rate; one thread's latency is n times it.
  double realTimeNs = 0;
  double cpuTimeNs = 0;
  int64_t iterations = 0;
  std::map<std::string, double> counters;  // user counters as Google Benchmark reports them
};

// Initialises and runs every registered benchmark (console output as usual), honouring the
// usual --benchmark_* flags. Returns the cases that ran (aggregates excluded).
std::vector<CaseResult> runBenchmarks(int* argc, char** argv);

// The first case whose name starts with `prefix`, or nullptr.
const CaseResult* findCase(const std::vector<CaseResult>& cases, const std::string& prefix);

// Prints "RESULT <bench> k1=v1 k2=v2 ..." on stdout.
void printResult(const std::string& bench,
                 const std::vector<std::pair<std::string, std::string>>& fields);

// Formats a number with `digits` significant decimals ("41.2", "0.0031").
std::string num(double value, int digits = 4);

}  // namespace cofab::bench
