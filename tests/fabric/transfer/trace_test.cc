// The transfer trace: a real run's records exported as Chrome trace-event JSON parse as JSON
// (strict parser in json_check.h), have the fields the viewers need, and pair every "b" with
// an "e" on the same id; names with quotes are escaped.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
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
    ASSERT_TRUE(e.get("id") && e.get("tid"));
    open[e.get("id")->number] += ph->string == "b" ? 1 : -1;
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

TEST(TransferTrace, NamesAreEscaped) {
  transfer::TransferRecord r;
  r.name = "a \"quoted\" \\ name\n";
  r.outcome = "ok";
  r.queuedNs = 1000;
  r.sentNs = 2000;
  r.ackedNs = 3000;
  r.doneNs = 4000;
  JsonValue root;
  std::string err;
  const std::string json = transfer::chromeTraceJson({r}, 3, "worker \"3\"");
  ASSERT_TRUE(JsonParser::parse(json, &root, &err)) << err << "\n" << json;
  EXPECT_EQ(root.get("traceEvents")->array.size(), 1u + 1u + 6u);
}

}  // namespace
}  // namespace cofab::testing
