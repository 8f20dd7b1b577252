#include "io/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "testing/files.h"
#include "testing/temp_dir.h"

namespace tpudist::io {
namespace {

TEST(Safetensors, RoundTripsAllDtypes) {
  test_support::ScopedTempDir dir("io_test");
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32", at::randn({3, 5})},
      {"bf16", at::randn({7}).to(at::kBFloat16)},
      {"f16", at::randn({2, 2}).to(at::kHalf)},
      {"i64", at::arange(6, at::kLong).view({2, 3})},
      {"u8", at::arange(5, at::kLong).to(at::kByte)},
      {"scalar", at::scalar_tensor(2.5, at::kFloat)},
      {"empty", at::zeros({0, 4})},
      {"strided", at::randn({4, 6}).t()},
  };
  const std::string path = dir / "m.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->entries().size(), tensors.size());
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  for (const auto& [name, t] : tensors) {
    auto got = (*file)->Get(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(*got, t)) << name;
  }
  // Zero-copy view outlives the file object and is writable (copy-on-write).
  at::Tensor view = *(*file)->Get("f32");
  file->reset();
  view.add_(1.0);
  EXPECT_TRUE(at::allclose(view, tensors[0].second + 1.0));
  auto again = SafetensorsFile::Open(path);
  EXPECT_TRUE(at::equal(*(*again)->Get("f32"), tensors[0].second));  // file untouched
  auto missing = (*again)->Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
}

TEST(Safetensors, HeaderIsPaddedAndLittleEndian) {
  test_support::ScopedTempDir dir("io_test");
  ASSERT_TRUE(WriteSafetensors(dir / "a.safetensors", {{"x", at::ones({1})}}).ok());
  const std::string bytes = test_support::ReadFile(dir / "a.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 4);
  EXPECT_EQ(bytes[8], '{');
}

std::string Header(const std::string& json) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

TEST(Safetensors, RejectsCorruptFiles) {
  test_support::ScopedTempDir dir("io_test");
  struct Case {
    const char* name;
    std::string bytes;
    const char* needle;
  } cases[] = {
      {"short", "abc", "shorter"},
      {"len", std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + "{}", "header length"},
      {"json", Header("{nope"), "JSON"},
      {"dtype", Header(R"({"t":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}})") + "x", "'t'"},
      {"bounds", Header(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})") + "1234", "outside"},
      {"size", Header(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})") + "1234", "need"},
      {"overlap",
       Header(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})") +
           "abc",
       "overlap"},
      // shape x dtype wraps to 0 bytes in 64 bits (found by fuzz/).
      {"overflow", Header(R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})"),
       "exceeds 2^64"},
  };
  for (const auto& c : cases) {
    const std::string path = dir / (std::string(c.name) + ".safetensors");
    test_support::WriteFile(path, c.bytes);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status();
    EXPECT_NE(f.status().message().find(c.needle), std::string::npos) << c.name << ": " << f.status();
  }
  EXPECT_EQ(SafetensorsFile::Open(dir / "absent").status().code(), absl::StatusCode::kNotFound);
}

// The torch-free header parser and the at::ScalarType table agree on every dtype.
TEST(Safetensors, DtypeTablesAgree) {
  for (const char* name : {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"}) {
    absl::StatusOr<at::ScalarType> type = SafetensorsDtype(name);
    absl::StatusOr<size_t> size = SafetensorsDtypeSize(name);
    ASSERT_TRUE(type.ok() && size.ok()) << name;
    EXPECT_EQ(*size, c10::elementSize(*type)) << name;
  }
  EXPECT_FALSE(SafetensorsDtypeSize("F8").ok());
}

TEST(Safetensors, UnalignedDataIsCopied) {
  test_support::ScopedTempDir dir("io_test");
  // F32 tensor at data offset 1: not 4-aligned, must still read correctly.
  std::string json = R"({"p":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  while ((json.size()) % 8 != 0) json.push_back(' ');
  float v = 3.25f;
  std::string data(5, '\0');
  std::memcpy(&data[1], &v, 4);
  test_support::WriteFile(dir / "u.safetensors", Header(json) + data);
  auto f = SafetensorsFile::Open(dir / "u.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Get("t")->item<float>(), 3.25f);
}

// A full disk: the error says so (strerror of ENOSPC) and names the file.
// <path>.tmp is a symlink to /dev/full, whose writes fail with ENOSPC.
TEST(Safetensors, WriteErrorCarriesErrnoAndPath) {
  test_support::ScopedTempDir dir("io_test");
  const std::string path = dir / "m.safetensors";
  ASSERT_EQ(symlink("/dev/full", (path + ".tmp").c_str()), 0);
  absl::Status st = WriteSafetensors(path, {{"w", at::zeros({1024})}});
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st;
  EXPECT_NE(st.message().find(path + ".tmp"), std::string::npos) << st;
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));  // the symlink went too
  st = WriteSafetensors(dir / "absent_dir/m.safetensors", {{"w", at::zeros({1})}});
  EXPECT_NE(st.message().find("No such file or directory"), std::string::npos) << st;
}

// ReadSafetensors: owned copies of everything, metadata, and the same
// validation (and messages) as Open.
TEST(Safetensors, ReadSafetensorsCopiesEverything) {
  test_support::ScopedTempDir dir("io_test");
  const std::string path = dir / "r.safetensors";
  const at::Tensor w = at::randn({3, 4});        // [3, 4]
  const at::Tensor b = at::arange(5, at::kInt);  // [5]
  ASSERT_TRUE(WriteSafetensors(path, {{"w", w}, {"b", b}}, {{"format", "pt"}}).ok());
  absl::StatusOr<SafetensorsContents> got = ReadSafetensors(path);
  ASSERT_TRUE(got.ok()) << got.status();
  std::filesystem::remove(path);
  ASSERT_EQ(got->tensors.size(), 2u);
  EXPECT_TRUE(at::equal(got->tensors.at("w"), w));
  EXPECT_TRUE(at::equal(got->tensors.at("b"), b));
  EXPECT_EQ(got->metadata.at("format"), "pt");
  test_support::WriteFile(path, Header(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})") + "1234");
  absl::Status st = ReadSafetensors(path).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find(path), std::string::npos) << st;
  EXPECT_NE(st.message().find("'t'"), std::string::npos) << st;
  EXPECT_EQ(ReadSafetensors(dir / "absent").status().code(), absl::StatusCode::kNotFound);
}

// Bad input to the writer names the file and the tensor, and writes nothing.
TEST(Safetensors, WriterRejectsDuplicatesAndUnsupportedDtypes) {
  test_support::ScopedTempDir dir("io_test");
  const std::string path = dir / "bad.safetensors";
  absl::Status st = WriteSafetensors(path, {{"a", at::ones({1})}, {"a", at::ones({1})}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(path), std::string::npos) << st;
  EXPECT_NE(st.message().find("'a'"), std::string::npos) << st;
  st = WriteSafetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("'c'"), std::string::npos) << st;
  EXPECT_EQ(test_support::CountEntries(dir.path()), 0);
}

}  // namespace
}  // namespace tpudist::io
