#include "tpu_runtime/coordination/coordination_store.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

// The one Status -> exception bridge of this folder.
void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) TORCH_CHECK(false, status.ToString());
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  ThrowIfError(value.status());
  return *std::move(value);
}

std::string ToString(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> ToBytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

absl::Duration EffectiveTimeout(std::chrono::milliseconds timeout) {
  if (timeout == c10d::Store::kNoTimeout)
    timeout = c10d::Store::kDefaultTimeout;
  return absl::FromChrono(timeout);
}

}  // namespace

CoordinationStore::CoordinationStore(std::shared_ptr<CoordinationClient> client,
                                     std::chrono::milliseconds timeout,
                                     std::string key_prefix)
    : c10d::Store(timeout),
      client_(std::move(client)),
      prefix_(std::move(key_prefix)) {
  TORCH_CHECK(client_ != nullptr, "CoordinationStore: null client");
}

CoordinationStore::~CoordinationStore() = default;

c10::intrusive_ptr<c10d::Store> CoordinationStore::clone() {
  return c10::make_intrusive<CoordinationStore>(client_, timeout_, prefix_);
}

void CoordinationStore::set(const std::string& key,
                            const std::vector<uint8_t>& value) {
  ThrowIfError(
      client_->Set(Key(key), ToString(value), /*allow_overwrite=*/true));
}

std::vector<uint8_t> CoordinationStore::compareSet(
    const std::string& key, const std::vector<uint8_t>& currentValue,
    const std::vector<uint8_t>& newValue) {
  return ToBytes(ValueOrThrow(client_->CompareSet(
      Key(key), ToString(currentValue), ToString(newValue))));
}

std::vector<uint8_t> CoordinationStore::get(const std::string& key) {
  return ToBytes(
      ValueOrThrow(client_->Get(Key(key), EffectiveTimeout(timeout_))));
}

int64_t CoordinationStore::add(const std::string& key, int64_t value) {
  return ValueOrThrow(client_->Add(Key(key), value));
}

bool CoordinationStore::deleteKey(const std::string& key) {
  return ValueOrThrow(client_->Delete(Key(key)));
}

bool CoordinationStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& key : keys) full.push_back(Key(key));
  return ValueOrThrow(client_->Check(full));
}

int64_t CoordinationStore::getNumKeys() {
  return ValueOrThrow(client_->NumKeys(prefix_));
}

void CoordinationStore::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void CoordinationStore::wait(const std::vector<std::string>& keys,
                             const std::chrono::milliseconds& timeout) {
  const absl::Duration total = EffectiveTimeout(timeout);
  const absl::Time deadline = absl::Now() + total;
  for (const std::string& key : keys) {
    const absl::Duration left =
        std::max(absl::Milliseconds(1), deadline - absl::Now());
    absl::StatusOr<std::string> value = client_->Get(Key(key), left);
    if (absl::IsDeadlineExceeded(value.status())) {
      ThrowIfError(absl::DeadlineExceededError(absl::StrCat(
          "CoordinationStore::wait: keys not all set within ",
          absl::FormatDuration(total), ": ", value.status().message())));
    }
    ThrowIfError(value.status());
  }
}

}  // namespace tpudist::tpu_runtime::coordination
