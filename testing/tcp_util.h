// Helpers shared by the tcp_test files: run W ranks as threads, connect W
// TcpMeshes concurrently over one store, element-wise sum reducers, and
// deterministic test data. Test-only; not part of the library.

#ifndef TPU_DIST_COLLECTIVES_TCP_TEST_UTIL_H_
#define TPU_DIST_COLLECTIVES_TCP_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/tcp/ring_algorithms.h"
#include "collectives/tcp/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace tpudist::collectives::tcp::testing {

// Runs fn(rank) for rank in [0, world) on `world` threads and joins them
// (testing/rank_threads.h: a rank still running after 300 s aborts the
// binary). Every fn must itself be bounded by deadlines (all transport calls
// are).
void RunRanks(int world, const std::function<void(int rank)>& fn);

// Connects `world` meshes over `store` concurrently (one thread per rank).
// Returns the first error if any rank fails.
absl::StatusOr<std::vector<std::unique_ptr<TcpMesh>>> ConnectAll(c10d::Store& store, int world,
                                                                 const TcpMeshOptions& options);

// A group key unique within this process run: "<prefix>-<pid>-<n>".
std::string UniqueKey(const std::string& prefix);

template <typename T>
ReduceFn SumReducer() {
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

}  // namespace tpudist::collectives::tcp::testing

#endif  // TPU_DIST_COLLECTIVES_TCP_TEST_UTIL_H_
