// Asks a server's grpc.health.v1 service for one service's status (the health protos' stubs
// are not installed by Debian, so the two tiny messages are encoded by hand).
#pragma once

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"

namespace thetaserve::server {

// "SERVING", "NOT_SERVING", "UNKNOWN", "SERVICE_UNKNOWN", or "error: <message>".
std::string ProbeHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                        double timeout_s);

}  // namespace thetaserve::server
