// server/grpc/grpc_server.h: the gRPC front end (tessera.v1 service, grpc.health.v1.Health and
// reflection), built on the shared front-end layer (server/frontend). `tessera serve` starts it.
#pragma once

#include <chrono>
#include <memory>

namespace tessera {

class Frontend;
struct ServerConfig;

class GrpcServer {
 public:
  virtual ~GrpcServer() = default;
  virtual int port() const = 0;  // the bound port (config.grpc.port 0: chosen by the OS)
  // SIGTERM: health reports NOT_SERVING; new RPCs are refused with UNAVAILABLE by the front end.
  virtual void begin_drain() = 0;
  // The engine's health, as the serve loop last saw it: grpc.health.v1 reports NOT_SERVING while it is
  // false (gRPC health is pushed, not asked for). Ignored after begin_drain().
  virtual void set_engine_healthy(bool healthy) = 0;
  // Stops accepting, waits up to `grace` for in-flight RPCs, then cancels the rest.
  virtual void shutdown(std::chrono::milliseconds grace) = 0;
};

// Binds config.grpc.host:port and starts serving on its own threads. Throws tessera::Error when it
// cannot bind. API keys: `authorization: Bearer <key>` metadata, checked with
// Frontend::check_api_key on every tessera.v1 RPC. grpc.health.v1.Health (gRPC's default service) and
// reflection need no key: load-balancer and Kubernetes gRPC probes send no metadata, and neither
// reveals more than the service names.
std::unique_ptr<GrpcServer> start_grpc_server(const ServerConfig& config, Frontend& frontend);

}  // namespace tessera
