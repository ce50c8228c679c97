#include "fabric/transfer/transfer_trace.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace cofab::transfer {

namespace {

void appendEscaped(std::ostringstream& os, std::string_view s) {
  os << '"';
  for (char c : s) {
    switch (c) {
      case '"':
        os << "\\\"";
        break;
      case '\\':
        os << "\\\\";
        break;
      case '\n':
        os << "\\n";
        break;
      case '\t':
        os << "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          os << buf;
        } else {
          os << c;
        }
    }
  }
  os << '"';
}

void appendTs(std::ostringstream& os, int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  os << buf;
}

// One async slice ("b" ... "e") of record `id`. The id is scoped to the process ("id2":
// {"local": ...}): every worker numbers its records from 0, and a plain "id" is global to the
// viewers, which would pair one worker's "b" with another's "e" in a merged trace.
void appendSlice(std::ostringstream& os, bool& first, const TransferRecord& r, uint64_t id, int pid,
                 const char* phase, int64_t from, int64_t to) {
  if (from == 0 || to == 0 || to < from) return;
  for (int end = 0; end < 2; ++end) {
    os << (first ? "" : ",\n") << "{\"name\":\"" << phase << "\",\"cat\":\"transfer\",\"ph\":\""
       << (end ? 'e' : 'b') << "\",\"id2\":{\"local\":" << id << "},\"pid\":" << pid
       << ",\"tid\":" << r.destination << ",\"ts\":";
    appendTs(os, end ? to : from);
    if (!end) {
      os << ",\"args\":{\"unit\":";
      appendEscaped(os, r.name);
      os << ",\"bytes\":" << r.bytes << ",\"priority\":" << r.priority
         << ",\"iteration\":" << r.iteration << ",\"outcome\":";
      appendEscaped(os, r.outcome);
      os << '}';
    }
    os << '}';
    first = false;
  }
}

}  // namespace

std::string chromeTraceJson(const std::vector<TransferRecord>& records, int pid,
                            std::string_view processName) {
  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << pid << ",\"args\":{\"name\":";
  appendEscaped(os, processName);
  os << "}}";
  first = false;
  int maxDest = -1;
  for (const auto& r : records) maxDest = std::max(maxDest, r.destination);
  for (int d = 0; d <= maxDest; ++d) {
    os << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << pid << ",\"tid\":" << d
       << ",\"args\":{\"name\":\"to aggregator " << d << "\"}}";
  }
  for (size_t i = 0; i < records.size(); ++i) {
    const TransferRecord& r = records[i];
    // Distinct ids per phase so that the viewer never pairs a "b" with another phase's "e".
    const uint64_t id = static_cast<uint64_t>(i) * 4;
    const int64_t queuedEnd = r.sentNs != 0 ? r.sentNs : r.doneNs;
    appendSlice(os, first, r, id, pid, "queued", r.queuedNs, queuedEnd);
    appendSlice(os, first, r, id + 1, pid, "sent", r.sentNs, r.ackedNs);
    appendSlice(os, first, r, id + 2, pid, "reduce", r.ackedNs, r.doneNs);
  }
  os << "\n]}\n";
  return os.str();
}

Status writeChromeTrace(const std::string& path, const std::vector<TransferRecord>& records,
                        int pid, std::string_view processName) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return IoError("cannot open trace file '" + path + "': " + std::strerror(errno));
  out << chromeTraceJson(records, pid, processName);
  out.flush();
  if (!out) return IoError("writing trace file '" + path + "' failed");
  return OkStatus();
}

}  // namespace cofab::transfer
