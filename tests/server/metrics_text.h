#pragma once

// Reading the Prometheus text format in tests: an HTTP GET on loopback, and a lookup of a sample.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace praxis::serve::fixtures {

// The body of GET http://127.0.0.1:port/path (HTTP/1.0, so the server closes the connection), or
// "" if the request fails. Waits at most 10 s.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, n);
    }
  }
  close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

// The sum of the samples of `name` whose labels include every pair of `labels`; nullopt if none.
inline std::optional<double> Sample(const std::string& text, const std::string& name,
                                    const std::map<std::string, std::string>& labels = {}) {
  std::istringstream in(text);
  std::optional<double> sum;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    const std::string series = line.substr(0, space);
    const std::string metric = series.substr(0, series.find('{'));
    if (metric != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      match = match && absl::StrContains(series, absl::StrCat(k, "=\"", v, "\""));
    }
    double value = 0;
    if (match && absl::SimpleAtod(line.substr(space + 1), &value)) sum = sum.value_or(0) + value;
  }
  return sum;
}

}  // namespace praxis::serve::fixtures
