#include "core/param.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

namespace cofab {
namespace {

COFAB_PARAM_INT(kTestInt, "COFAB_TEST_INT", 7, 1, 100, "an int for tests");
COFAB_PARAM_BOOL(kTestBool, "COFAB_TEST_BOOL", false, "a bool for tests");
COFAB_PARAM_DOUBLE(kTestDouble, "COFAB_TEST_DOUBLE", 0.5, 0.0, 1.0, "a fraction for tests");
COFAB_PARAM_STRING(kTestString, "COFAB_TEST_STRING", "abc", "a string for tests");
COFAB_PARAM_ENUM(kTestEnum, "COFAB_TEST_ENUM", "ring", (std::vector<std::string>{"ring", "tree"}),
                 "an enum for tests");

TEST(ParamTest, DefaultsWhenUnset) {
  EXPECT_EQ(*kTestInt.get(), 7);
  EXPECT_FALSE(*kTestBool.get());
  EXPECT_DOUBLE_EQ(*kTestDouble.get(), 0.5);
  EXPECT_EQ(*kTestString.get(), "abc");
  EXPECT_EQ(*kTestEnum.get(), "ring");
}

TEST(ParamTest, EnvironmentIsReadAndOverrideWins) {
  ::setenv("COFAB_TEST_INT", "42", 1);
  EXPECT_EQ(*kTestInt.get(), 42);
  {
    ScopedParamOverride o("COFAB_TEST_INT", "9");
    EXPECT_EQ(*kTestInt.get(), 9);
    {
      ScopedParamOverride inner("COFAB_TEST_INT", "10");
      EXPECT_EQ(*kTestInt.get(), 10);
    }
    EXPECT_EQ(*kTestInt.get(), 9);
  }
  EXPECT_EQ(*kTestInt.get(), 42);
  ::unsetenv("COFAB_TEST_INT");
}

TEST(ParamTest, MalformedValuesNameTheVariableAndTheAcceptedForm) {
  for (const char* bad :
       {"", "abc", "12x", "0", "101", "99999999999999999999999", " 5", "+5", "\t5", "\n5", "5 "}) {
    ScopedParamOverride o("COFAB_TEST_INT", bad);
    auto v = kTestInt.get();
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find("COFAB_TEST_INT"), std::string::npos);
    EXPECT_NE(v.status().message().find("[1, 100]"), std::string::npos);
  }
  {
    ScopedParamOverride o("COFAB_TEST_BOOL", "maybe");
    EXPECT_FALSE(kTestBool.get().ok());
  }
  for (const char* yes : {"1", "true", "YES", "On"}) {
    ScopedParamOverride o("COFAB_TEST_BOOL", yes);
    EXPECT_TRUE(*kTestBool.get()) << yes;
  }
  {
    ScopedParamOverride o("COFAB_TEST_DOUBLE", "1.5");
    EXPECT_FALSE(kTestDouble.get().ok());
  }
  for (const char* bad : {"nan", " 0.5", "+0.5", "0x1p-1", "0.5 "}) {
    ScopedParamOverride o("COFAB_TEST_DOUBLE", bad);
    EXPECT_FALSE(kTestDouble.get().ok()) << bad;
  }
  {
    ScopedParamOverride o("COFAB_TEST_DOUBLE", "2.5e-1");
    EXPECT_DOUBLE_EQ(*kTestDouble.get(), 0.25);
  }
  {
    ScopedParamOverride o("COFAB_TEST_ENUM", "mesh");
    auto v = kTestEnum.get();
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("one of ring, tree"), std::string::npos);
  }
}

TEST(ParamTest, ListedWithTypeDefaultAndDoc) {
  auto params = listParams();
  auto it = std::find_if(params.begin(), params.end(),
                         [](const ParamInfo& p) { return p.name == "COFAB_TEST_ENUM"; });
  ASSERT_NE(it, params.end());
  EXPECT_EQ(it->type, "enum");
  EXPECT_EQ(it->defaultText, "ring");
  EXPECT_EQ(it->doc, "an enum for tests");
  EXPECT_TRUE(std::is_sorted(params.begin(), params.end(),
                             [](const ParamInfo& a, const ParamInfo& b) { return a.name < b.name; }));
}

}  // namespace
}  // namespace cofab
