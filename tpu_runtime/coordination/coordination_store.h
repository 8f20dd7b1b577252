// CoordinationStore: a c10d::Store over a CoordinationClient, so that
// ProcessGroupGloo and the tpu_dist process group rendezvous through the
// coordination service instead of a separate TCPStore.
//
// Keys are stored in the service under `key_prefix` (default "c10d/"), so
// getNumKeys() counts only this store's keys and c10d keys cannot collide
// with the runtime's own. set() overwrites (c10d semantics); add() keeps a
// decimal string; compareSet() follows TCPStore.
//
// Errors: this is the torch boundary. Every failed call throws c10::Error
// whose message is the absl::Status text (op, key, task, address, elapsed vs
// timeout). get() and wait() honour the store timeout (getTimeout /
// setTimeout); c10d's kNoTimeout (0) is replaced by kDefaultTimeout (300 s)
// because every wait here has a deadline.
//
// Ownership: shares the client with whoever else uses it (the runtime).
// Thread-safety: as thread-safe as c10d::Store requires: all calls may run
// concurrently (the client is thread-safe); setTimeout races with waits as
// in every c10d store.
#ifndef TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_STORE_H_
#define TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "tpu_runtime/coordination/coordination_client.h"

namespace tpudist::tpu_runtime::coordination {

class CoordinationStore : public c10d::Store {
 public:
  // REQUIRES: client != nullptr (and registered, so that the service's
  // failure detection covers this task).
  explicit CoordinationStore(
      std::shared_ptr<CoordinationClient> client,
      std::chrono::milliseconds timeout = c10d::Store::kDefaultTimeout,
      std::string key_prefix = "c10d/");
  ~CoordinationStore() override;

  // A store over the same client and prefix (c10d uses clones from other
  // threads; the client is thread-safe).
  c10::intrusive_ptr<c10d::Store> clone() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(
      const std::string& key, const std::vector<uint8_t>& currentValue,
      const std::vector<uint8_t>& newValue) override;
  // Blocks until the key is set or the store timeout passes.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  // All keys must be set within `timeout` in total.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  const std::shared_ptr<CoordinationClient>& client() const { return client_; }

 private:
  std::string Key(const std::string& key) const { return prefix_ + key; }

  const std::shared_ptr<CoordinationClient> client_;
  const std::string prefix_;
};

}  // namespace tpudist::tpu_runtime::coordination

#endif  // TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_STORE_H_
