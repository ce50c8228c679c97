// The transfer trace: a real run's records exported as Chrome trace-event JSON parse as JSON
// (strict parser in json_check.h), have the fields the viewers need, and pair every "b" with
// an "e" on the same id; names with quotes are escaped.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "fabric/transfer/transfer_manager.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/fabric/transfer/json_check.h"
#include "tests/support/temp_dir.h"

namespace cofab::testing {
namespace {

using transfer::GradientUpdate;
using transfer::TransferManager;

TEST(TransferTrace, ExportIsValidTraceEventJson) {
  DaemonCluster cluster(2, 1);
  ASSERT_TRUE(cluster.start().ok());
  ps::ClientOptions co;
  co.chunkBytes = 4096;
  auto client = cluster.connect(0, co);
  ASSERT_TRUE(client.ok()) << client.status();
  transfer::TransferOptions o;
  o.fuseBelowBytes = 512;
  auto mgr = TransferManager::create(**client, o);
  ASSERT_TRUE(mgr.ok()) << mgr.status();
  std::vector<std::vector<float>> data = {
      std::vector<float>(5000, 1.0f), std::vector<float>(10, 2.0f), std::vector<float>(20, 3.0f)};
  std::vector<transfer::TransferHandle> hs;
  for (size_t i = 0; i < data.size(); ++i) {
    GradientUpdate g;
    g.key = 40 + i;
    g.tensor = TensorView::of(data[i].data(), data[i].size(), DType::kF32);
    g.priority = static_cast<int>(i);
    hs.push_back((*mgr)->enqueue(g));
  }
  (*mgr)->flush();
  for (auto& h : hs) ASSERT_TRUE(h.wait(Deadline::afterMs(20000)).ok()) << h.status();

  // Stats: per destination bytes add up, every unit was sent and none is still queued.
  const auto st = (*mgr)->stats();
  ASSERT_EQ(st.destinations.size(), 2u);
  uint64_t bytes = 0, units = 0;
  for (const auto& d : st.destinations) {
    bytes += d.bytesSent;
    units += d.unitsSent;
    EXPECT_EQ(d.queued, 0u);
    EXPECT_LE(d.maxQueued, 6u);
  }
  EXPECT_EQ(bytes, st.bytesSent);
  EXPECT_EQ(bytes, (5000 + 10 + 20) * sizeof(float));
  EXPECT_EQ(units, st.chunksSent + st.bucketsSent);
  EXPECT_EQ(st.chunksSent, 5u);
  EXPECT_EQ(st.bucketsSent, 1u);
  EXPECT_EQ(st.updatesCompleted, 3u);

  TempDir dir;
  const std::string path = dir.path() + "/transfer.json";
  ASSERT_TRUE((*mgr)->writeTrace(path).ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  JsonValue root;
  std::string err;
  ASSERT_TRUE(JsonParser::parse(ss.str(), &root, &err)) << err << "\n" << ss.str();
  ASSERT_EQ(root.kind, JsonValue::Kind::kObject);
  const JsonValue* events = root.get("traceEvents");
  ASSERT_NE(events, nullptr);
  ASSERT_EQ(events->kind, JsonValue::Kind::kArray);
  std::map<double, int> open;  // async id -> begins - ends
  int begins = 0;
  bool sawBucket = false;
  for (const JsonValue& e : events->array) {
    ASSERT_EQ(e.kind, JsonValue::Kind::kObject);
    const JsonValue* ph = e.get("ph");
    ASSERT_TRUE(ph && ph->kind == JsonValue::Kind::kString);
    ASSERT_TRUE(e.get("pid") && e.get("pid")->kind == JsonValue::Kind::kNumber);
    ASSERT_TRUE(e.get("name") && e.get("name")->kind == JsonValue::Kind::kString);
    if (ph->string == "M") continue;
    ASSERT_TRUE(ph->string == "b" || ph->string == "e") << ph->string;
    ASSERT_TRUE(e.get("ts") && e.get("ts")->kind == JsonValue::Kind::kNumber);
    ASSERT_TRUE(e.get("tid"));
    const JsonValue* id2 = e.get("id2");
    ASSERT_TRUE(id2 && id2->get("local")) << "async events carry a process-scoped id2.local";
    open[id2->get("local")->number] += ph->string == "b" ? 1 : -1;
    if (ph->string == "b") {
      ++begins;
      const JsonValue* args = e.get("args");
      ASSERT_TRUE(args && args->get("unit") && args->get("bytes"));
      if (args->get("unit")->string.rfind("bucket", 0) == 0) sawBucket = true;
    }
  }
  for (const auto& [id, n] : open) EXPECT_EQ(n, 0) << "unpaired async id " << id;
  // 5 chunks + 1 bucket, each queued / sent / reduce.
  EXPECT_EQ(begins, 6 * 3);
  EXPECT_TRUE(sawBucket);
}

// A finished record with every phase 1 us long.
transfer::TransferRecord finishedRecord(std::string name) {
  transfer::TransferRecord r;
  r.name = std::move(name);
  r.outcome = "ok";
  r.queuedNs = 1000;
  r.sentNs = 2000;
  r.ackedNs = 3000;
  r.doneNs = 4000;
  return r;
}

TEST(TransferTrace, NamesAreEscaped) {
  const transfer::TransferRecord r = finishedRecord("a \"quoted\" \\ name\n");
  JsonValue root;
  std::string err;
  const std::string json = transfer::chromeTraceJson({r}, 3, "worker \"3\"");
  ASSERT_TRUE(JsonParser::parse(json, &root, &err)) << err << "\n" << json;
  EXPECT_EQ(root.get("traceEvents")->array.size(), 1u + 1u + 6u);
}

// Workers' traces are merged by concatenating their traceEvents (docs/TRANSFER.md). Every
// worker numbers its records from 0, so an async id the viewer takes as global (plain "id")
// would pair worker 0's "b" with worker 1's "e"; ids must be scoped to the process.
TEST(TransferTrace, AsyncIdsOfTwoWorkersDoNotCollideWhenMerged) {
  const transfer::TransferRecord r = finishedRecord("key=1 chunk=1/1");
  std::map<std::string, std::set<int>> pidsOfKey;  // viewer's pairing key -> processes using it
  for (int pid = 0; pid < 2; ++pid) {
    JsonValue root;
    std::string err;
    const std::string json = transfer::chromeTraceJson({r, r}, pid, "worker");
    ASSERT_TRUE(JsonParser::parse(json, &root, &err)) << err << "\n" << json;
    for (const JsonValue& e : root.get("traceEvents")->array) {
      if (e.get("ph")->string == "M") continue;
      std::string key;
      if (const JsonValue* id = e.get("id")) {
        key = "global:" + std::to_string(id->number);
      } else if (const JsonValue* id2 = e.get("id2"); id2 && id2->get("local")) {
        key = "pid" + std::to_string(pid) + ":" + std::to_string(id2->get("local")->number);
      } else if (id2 && id2->get("global")) {
        key = "global:" + std::to_string(id2->get("global")->number);
      }
      ASSERT_FALSE(key.empty()) << "an async event without an id";
      pidsOfKey[key].insert(pid);
    }
  }
  for (const auto& [key, pids] : pidsOfKey) {
    EXPECT_EQ(pids.size(), 1u) << "async id " << key << " is shared by two workers' traces";
  }
}

}  // namespace
}  // namespace cofab::testing
