// server/grpc/grpc_server.cpp: builds and runs the gRPC server: tessera.v1.InferenceService, the
// standard grpc.health.v1.Health service and server reflection, on an OS-chosen or configured port.
#include "server/grpc/grpc_server.h"

#include <mutex>
#include <string>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "server/config/server_config.h"
#include "server/frontend/frontend.h"
#include "server/grpc/grpc_service.h"

namespace tessera {
namespace {

constexpr const char* kServiceName = "tessera.v1.InferenceService";

std::string listen_address(const std::string& host, int32_t port) {
  // IPv6 literals need brackets in a gRPC address.
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

class GrpcServerImpl final : public GrpcServer {
 public:
  GrpcServerImpl(const ServerConfig& config, Frontend& frontend) : service_(frontend) {
    // Both are process-wide switches that must be set before the first ServerBuilder is made.
    static std::once_flag once;
    std::call_once(once, [] {
      grpc::EnableDefaultHealthCheckService(true);
      grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    });
    const std::string address = listen_address(config.grpc.host, config.grpc.port);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    TESSERA_CHECK(server_ != nullptr && port_ != 0,
                  "grpc: cannot listen on " << address << " (grpc.host / grpc.port: in use or not a local address?)");
    set_serving(true);
    spdlog::info("grpc: listening on {}", listen_address(config.grpc.host, port_));
    if (config.auth.protect_health) {
      spdlog::warn("grpc: auth.protect_health covers HTTP /health and /ready only; grpc.health.v1.Health stays "
                   "open (probes send no metadata)");
    }
  }

  ~GrpcServerImpl() override { shutdown(std::chrono::milliseconds(0)); }

  int port() const override { return port_; }

  void begin_drain() override {
    // New inference RPCs are refused by the front end (UNAVAILABLE); load balancers see NOT_SERVING.
    std::lock_guard<std::mutex> lock(shutdown_mutex_);
    draining_ = true;
    if (!stopped_) set_serving(false);
  }

  void set_engine_healthy(bool healthy) override {
    std::lock_guard<std::mutex> lock(shutdown_mutex_);
    if (stopped_ || draining_ || healthy == engine_healthy_) return;
    engine_healthy_ = healthy;
    set_serving(healthy);
  }

  void shutdown(std::chrono::milliseconds grace) override {
    std::lock_guard<std::mutex> lock(shutdown_mutex_);
    if (stopped_) return;
    stopped_ = true;
    set_serving(false);
    // Waits for in-flight RPCs until the deadline, then cancels them (streaming handlers see
    // IsCancelled() and cancel their engine requests).
    server_->Shutdown(std::chrono::system_clock::now() + grace);
    server_->Wait();
  }

 private:
  void set_serving(bool serving) {
    grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
    if (health == nullptr) return;
    health->SetServingStatus(serving);  // every service, and the server as a whole ("")
    health->SetServingStatus(kServiceName, serving);
  }

  InferenceService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex shutdown_mutex_;
  bool stopped_ = false;
  bool engine_healthy_ = true;  // guarded by shutdown_mutex_
  bool draining_ = false;       // guarded by shutdown_mutex_
};

}  // namespace

std::unique_ptr<GrpcServer> start_grpc_server(const ServerConfig& config, Frontend& frontend) {
  return std::make_unique<GrpcServerImpl>(config, frontend);
}

}  // namespace tessera
