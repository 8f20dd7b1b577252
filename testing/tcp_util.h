// Helpers shared by the tcp_test files: connect W TcpMeshes concurrently over
// one store (ranks as threads: testing/rank_threads.h), element-wise sum
// reducers, and deterministic test data. Test-only; not part of the library.
#ifndef TPU_DIST_TESTING_TCP_UTIL_H_
#define TPU_DIST_TESTING_TCP_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/tcp/ring_algorithms.h"
#include "collectives/tcp/tcp_mesh.h"
#include "testing/rank_threads.h"  // the tcp tests run their ranks through it

namespace c10d {
class Store;
}

namespace tpudist::test_support {

// Connects `world` meshes over `store` concurrently (one thread per rank).
// Returns the first error if any rank fails.
absl::StatusOr<std::vector<std::unique_ptr<collectives::tcp::TcpMesh>>> ConnectAll(
    c10d::Store& store, int world, const collectives::tcp::TcpMeshOptions& options);

// A group key unique within this process run: "<prefix>-<pid>-<n>".
std::string UniqueKey(const std::string& prefix);

template <typename T>
collectives::ReduceFn SumReducer() {
  return [](void* inout, const void* in, size_t count) {
    T* a = static_cast<T*>(inout);
    const T* b = static_cast<const T*>(in);
    for (size_t i = 0; i < count; ++i) a[i] += b[i];
  };
}

// Rank r's i-th input value for the all-reduce tests: small integers, so
// float sums over <= 16 ranks are exact and can be compared with ==.
inline float FloatInput(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 97) - 48);
}
inline int32_t IntInput(int rank, size_t i) {
  return static_cast<int32_t>((i * 2654435761u) ^ (rank * 40503u + 17));
}

// Byte i of rank r's contribution in the copying tests.
inline uint8_t ByteInput(int rank, size_t i) {
  return static_cast<uint8_t>((i * 31 + rank * 101 + 7) & 0xff);
}

template <typename T>
absl::Span<uint8_t> AsBytes(std::vector<T>& v) {
  return absl::MakeSpan(reinterpret_cast<uint8_t*>(v.data()), v.size() * sizeof(T));
}

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_TCP_UTIL_H_
