#include "bench/tcp_loopback.h"

#include <chrono>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "collectives/tcp/tcp_socket.h"

namespace tpudist::bench {

namespace tcp = ::tpudist::collectives::tcp;

absl::StatusOr<TcpLoopback> MeasureTcpLoopback(int64_t bytes, int repeats) {
  if (bytes <= 0 || repeats <= 0) {
    return absl::InvalidArgumentError("MeasureTcpLoopback: bytes and repeats must be > 0");
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  absl::StatusOr<tcp::Listener> listener = tcp::ListenTcp("127.0.0.1", 0, 1);
  if (!listener.ok()) return listener.status();
  // The connect completes from the listen backlog, before the accept.
  absl::StatusOr<tcp::ScopedFd> writer = tcp::ConnectUntil("127.0.0.1", listener->port, deadline);
  if (!writer.ok()) return writer.status();
  absl::StatusOr<tcp::ScopedFd> reader = tcp::AcceptUntil(listener->fd.get(), deadline);
  if (!reader.ok()) return reader.status();
  for (int fd : {writer->get(), reader->get()}) {
    if (absl::Status s = tcp::ConfigureStream(fd, 0); !s.ok()) return s;
  }
  std::vector<uint8_t> src(bytes, 0x5A), dst(bytes, 0);  // [bytes] each
  const int rounds = repeats + 1;  // round 0 warms up
  absl::Status write_status;
  std::thread write_thread([&] {
    for (int i = 0; i < rounds && write_status.ok(); ++i) {
      write_status = tcp::WriteAll(writer->get(), src, deadline);
    }
  });
  absl::Status read_status = tcp::ReadAll(reader->get(), absl::MakeSpan(dst), deadline);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1; i < rounds && read_status.ok(); ++i) {
    read_status = tcp::ReadAll(reader->get(), absl::MakeSpan(dst), deadline);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!read_status.ok()) writer->Reset();  // unblocks the writer with EPIPE
  write_thread.join();
  if (!read_status.ok()) return read_status;
  if (!write_status.ok()) return write_status;
  TcpLoopback r;
  r.bytes = bytes;
  r.repeats = repeats;
  r.seconds_per_copy = secs / repeats;
  r.gbytes_per_s = static_cast<double>(bytes) / r.seconds_per_copy / 1e9;
  return r;
}

}  // namespace tpudist::bench
