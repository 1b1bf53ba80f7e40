// The cpu-dev manifests, run as written (deploy/overlays/cpu-dev, and cpu-dev-mtls: the same
// with components/mtls): the test renders them with
// `kubectl kustomize`, and for every replica of every Deployment makes a pod: its own network
// namespace and address (tests/multinode/network_hosts.h), the container's command and args
// exactly as the manifest gives them, exactly its env (POD_IP from the downward API = the pod's
// address; Secret values, the cluster token), its volumes mounted at their mountPaths
// (ConfigMaps and Secrets as files, emptyDirs), as its runAsUser. The image's content comes
// from this build: its binaries on PATH, the shipped model at /opt/estuary/models. The Secret
// estuary-cluster-tls, which an operator makes, is made here with openssl. Service names
// resolve to the pods their selectors pick (the nodes' hosts file). Each pod is probed as the
// kubelet would (startup, then readiness and liveness: the probe's own port and gRPC service,
// or its HTTP path), then requests go through the router Service's port and must return the
// golden ids. Last, each pod's preStop runs and SIGTERM must end it with status 0 within
// terminationGracePeriodSeconds.
//
// Pods get no default route here, so a worker's advertised address can only come from POD_IP:
// a manifest without it fails. A wrong flag, port, probe port or probe service fails too.
// Skips, saying why, without kubectl, python3-yaml, openssl (mtls) or network namespaces.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/common/child_process.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster.h"
#include "tests/multinode/network_hosts.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/health_check.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::estuary::testing::BinaryPath;
using ::estuary::testing::NetworkHosts;
using ::estuary::testing::RunProcess;

const char kKubectl[] = "/usr/bin/kubectl";
const char kPython[] = "/usr/bin/python3";
const char kOpenssl[] = "/usr/bin/openssl";

// The rendered manifests as JSON objects; a skip reason when the tools are missing.
absl::StatusOr<std::vector<json>> Render(const fs::path& work, const std::string& overlay) {
  if (::access(kKubectl, X_OK) != 0) return absl::FailedPreconditionError("no kubectl");
  absl::StatusOr<testing::ProcessResult> rendered = RunProcess({kKubectl, "kustomize", overlay});
  if (!rendered.ok()) return rendered.status();
  if (rendered->exit_code != 0) return absl::InternalError("kubectl kustomize: " + rendered->err);
  const fs::path yaml = work / "rendered.yaml";
  std::ofstream(yaml) << rendered->out;
  absl::StatusOr<testing::ProcessResult> converted = RunProcess(
      {kPython, "-c",
       "import json, sys, yaml; "
       "json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], sys.stdout)",
       yaml.string()});
  if (!converted.ok()) return converted.status();
  if (converted->exit_code != 0) {
    return absl::FailedPreconditionError("python3 with yaml (python3-yaml): " + converted->err);
  }
  return json::parse(converted->out).get<std::vector<json>>();
}

// Whether something accepts TCP connections at address:port (a refused or unreachable port
// answers at once on these links).
bool Listens(const std::string& address, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(static_cast<uint16_t>(port));
  const bool parsed = ::inet_pton(AF_INET, address.c_str(), &peer.sin_addr) == 1;
  const bool connected =
      parsed && ::connect(fd, reinterpret_cast<const sockaddr*>(&peer), sizeof(peer)) == 0;
  ::close(fd);
  return connected;
}

bool Selects(const json& selector, const json& labels) {
  for (const auto& [key, value] : selector.items()) {
    if (!labels.contains(key) || labels[key] != value) return false;
  }
  return !selector.empty();
}

struct Probe {
  int port = 0;
  std::string service;    // gRPC health service (a grpc probe)
  std::string http_path;  // an httpGet probe's path; empty for a grpc probe
  int period_seconds = 10;
  int failure_threshold = 3;
};

struct Pod {
  std::string name;  // <deployment>-<replica>: the node's name
  json spec;         // the Deployment's pod template spec
  json labels;
  json annotations;
  std::vector<std::unique_ptr<ChildProcess>> containers;
};

class PodsAsWrittenTest : public ::testing::TestWithParam<const char*> {
 protected:
  void TearDown() override {
    pods_.clear();  // kills what is left
    hosts_.reset();
    std::error_code ec;
    for (auto it = made_dirs_.rbegin(); it != made_dirs_.rend(); ++it) fs::remove(*it, ec);
    fs::remove_all(work_, ec);
  }

  // A named or numbered container port.
  static int PortOf(const json& container, const json& port) {
    if (port.is_number()) return port.get<int>();
    for (const json& p : container.value("ports", json::array())) {
      if (p.value("name", "") == port.get<std::string>()) return p["containerPort"].get<int>();
    }
    ADD_FAILURE() << "container " << container["name"] << " has no port named " << port;
    return 0;
  }

  static Probe ProbeOf(const json& container, const char* kind) {
    Probe probe;
    const json& p = container.at(kind);
    if (p.contains("httpGet")) {
      probe.port = PortOf(container, p["httpGet"]["port"]);
      probe.http_path = p["httpGet"].value("path", "/");
    } else {
      EXPECT_TRUE(p.contains("grpc")) << kind << " of " << container["name"]
                                      << " is neither a gRPC nor an httpGet probe";
      probe.port = PortOf(container, p["grpc"]["port"]);
      probe.service = p["grpc"].value("service", "");
    }
    probe.period_seconds = p.value("periodSeconds", 10);
    probe.failure_threshold = p.value("failureThreshold", 3);
    return probe;
  }

  // secrets_["estuary-cluster-tls"]: a CA and one certificate for every pod (ca.crt, tls.crt,
  // tls.key), as deploy/README.md ("Security") makes them.
  absl::Status MakeClusterTlsSecret() {
    if (::access(kOpenssl, X_OK) != 0) return absl::FailedPreconditionError("no openssl");
    const fs::path dir = work_ / "pki";
    fs::create_directories(dir);
    const std::string d = dir.string();
    std::ofstream(dir / "node.ext") << "subjectAltName=DNS:estuary-cluster\n"
                                       "extendedKeyUsage=serverAuth,clientAuth\n";
    for (const std::vector<std::string>& step :
         {std::vector<std::string>{kOpenssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                                   "ec_paramgen_curve:P-256", "-nodes", "-keyout", d + "/ca.key",
                                   "-out", d + "/ca.crt", "-days", "2", "-subj", "/CN=ca"},
          std::vector<std::string>{kOpenssl, "req", "-newkey", "ec", "-pkeyopt",
                                   "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                                   d + "/tls.key", "-out", d + "/tls.csr", "-subj",
                                   "/CN=estuary-cluster"},
          std::vector<std::string>{kOpenssl, "x509", "-req", "-in", d + "/tls.csr", "-CA",
                                   d + "/ca.crt", "-CAkey", d + "/ca.key", "-CAcreateserial",
                                   "-out", d + "/tls.crt", "-days", "2", "-extfile",
                                   d + "/node.ext"}}) {
      absl::StatusOr<testing::ProcessResult> ran = RunProcess(step, absl::Seconds(30));
      if (!ran.ok()) return ran.status();
      if (ran->exit_code != 0) return absl::InternalError("openssl: " + ran->err);
    }
    for (const char* file : {"ca.crt", "tls.crt", "tls.key"}) {
      std::ifstream in(dir / file);
      std::stringstream content;
      content << in.rdbuf();
      secrets_["estuary-cluster-tls"][file] = content.str();
    }
    return absl::OkStatus();
  }

  // Makes a directory the manifests mount over, if the host lacks it (removed at the end).
  void EnsureMountPoint(const fs::path& path) {
    std::vector<fs::path> missing;
    for (fs::path p = path; !p.empty() && p != p.root_path() && !fs::exists(p); p = p.parent_path()) {
      missing.push_back(p);
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      fs::create_directory(*it);
      made_dirs_.push_back(*it);
    }
  }

  // One probe as the kubelet sends it: gRPC health SERVING, or an HTTP GET answering 200.
  static bool ProbePasses(const std::string& address, const Probe& probe) {
    if (!probe.http_path.empty()) {
      httplib::Client client(address, probe.port);
      client.set_connection_timeout(1);
      const httplib::Result got = client.Get(probe.http_path.c_str());
      return got && got->status == 200;
    }
    return testing::CheckHealth(absl::StrCat(address, ":", probe.port), probe.service)
               .value_or(testing::kNotServing) == testing::kServing;
  }

  // Polls a probe until it answers SERVING, for at most `bound` (capped at kLongestWaitHere);
  // fails at once, with the container's log, if the container has exited.
  void WaitServing(ChildProcess& container, const std::string& what, const std::string& address,
                   const Probe& probe, absl::Duration bound) {
    const absl::Time deadline = absl::Now() + std::min(bound, kLongestWaitHere);
    const std::string target = absl::StrCat(address, ":", probe.port);
    while (true) {
      if (ProbePasses(address, probe)) {
        return;
      }
      absl::StatusOr<int> exited = container.Wait(absl::ZeroDuration());
      ASSERT_FALSE(exited.ok()) << what << ": the container exited with " << *exited << "\n"
                                << container.Log();
      ASSERT_LT(absl::Now(), deadline) << what << " not SERVING on " << target << " (service '"
                                       << probe.service << "')\n" << container.Log();
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  // The pod_exec argv of one container (and of its preStop command when `command` is given).
  std::vector<std::string> ContainerArgv(const Pod& pod, const json& container,
                                         const std::vector<std::string>& command) {
    std::vector<std::string> argv = {BinaryPath("tests/deploy/pod_exec")};
    // Volumes.
    std::map<std::string, fs::path> volumes;
    for (const json& v : pod.spec.value("volumes", json::array())) {
      const fs::path dir = work_ / pod.name / "volumes" / v["name"].get<std::string>();
      fs::create_directories(dir);
      if (v.contains("configMap")) {
        const std::string name = v["configMap"]["name"];
        EXPECT_TRUE(config_maps_.count(name)) << "no ConfigMap " << name;
        for (const auto& [file, content] : config_maps_[name].items()) {
          std::ofstream(dir / file) << content.get<std::string>();
        }
      } else if (v.contains("emptyDir")) {
        fs::permissions(dir, fs::perms::all | fs::perms::sticky_bit);
      } else if (v.contains("secret")) {
        // As the kubelet writes a Secret: a file per key, defaultMode, group fsGroup.
        const std::string name = v["secret"]["secretName"];
        EXPECT_TRUE(secrets_.count(name)) << "no Secret " << name;
        const int mode = v["secret"].value("defaultMode", 0644);
        const json security = pod.spec.value("securityContext", json::object());
        for (const auto& [file, content] : secrets_[name]) {
          const fs::path path = dir / file;
          std::ofstream(path) << content;
          fs::permissions(path, static_cast<fs::perms>(mode));
          if (security.contains("fsGroup")) {
            EXPECT_EQ(::chown(path.c_str(), 0, security["fsGroup"].get<int>()), 0) << path;
          }
        }
      } else {
        ADD_FAILURE() << "volume " << v["name"] << ": only configMap, secret and emptyDir run here";
      }
      volumes[v["name"]] = dir;
    }
    for (const json& m : container.value("volumeMounts", json::array())) {
      const std::string mount_path = m["mountPath"];
      EXPECT_TRUE(volumes.count(m["name"])) << "mount of an undeclared volume " << m["name"];
      EnsureMountPoint(mount_path);
      argv.insert(argv.end(), {"--bind", absl::StrCat(volumes[m["name"]].string(), ":", mount_path,
                                                      m.value("readOnly", false) ? ":ro" : "")});
    }
    // The image's content: this build's binaries on PATH, the shipped model.
    EnsureMountPoint("/opt/estuary/models");
    argv.insert(argv.end(), {"--bind", absl::StrCat(fs::absolute("models").string(),
                                                    ":/opt/estuary/models:ro")});
    argv.insert(argv.end(), {"--env", "PATH=" + image_bin_.string() + ":/usr/bin:/bin"});
    for (const json& e : container.value("env", json::array())) {
      std::string value;
      if (e.contains("value")) {
        value = e["value"];
      } else if (e.contains("valueFrom") && e["valueFrom"].contains("fieldRef") &&
                 e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP") {
        value = hosts_->address(pod.name);
      } else if (e.contains("valueFrom") && e["valueFrom"].contains("secretKeyRef")) {
        // A Secret the manifests render (the cluster token): its key, as the kubelet decodes it.
        const json& ref = e["valueFrom"]["secretKeyRef"];
        const std::string name = ref["name"], key = ref["key"];
        EXPECT_TRUE(secrets_.count(name) && secrets_[name].count(key))
            << "env " << e["name"] << ": no Secret " << name << " with key " << key;
        if (secrets_.count(name) && secrets_[name].count(key)) value = secrets_[name][key];
      } else {
        ADD_FAILURE() << "env " << e["name"]
                      << ": only values, status.podIP and rendered Secrets run here";
      }
      argv.insert(argv.end(), {"--env", absl::StrCat(e["name"].get<std::string>(), "=", value)});
    }
    const json security = pod.spec.value("securityContext", json::object());
    if (security.contains("runAsUser")) {
      argv.insert(argv.end(), {"--user", absl::StrCat(security["runAsUser"].get<int>(), ":",
                                                      security.value("runAsGroup", 0))});
    }
    argv.push_back("--");
    argv.insert(argv.end(), command.begin(), command.end());
    return hosts_->Command(pod.name, argv);
  }

  // Not under /tmp: the workers mount an emptyDir there, which would hide the image's content.
  fs::path work_ = fs::path("/var/tmp") / absl::StrCat("estuary-pods-", ::getpid());
  fs::path image_bin_ = work_ / "image-bin";
  // The manifests allow a big model minutes to load; the tiny one here needs seconds.
  static constexpr absl::Duration kLongestWaitHere = absl::Seconds(60);
  std::unique_ptr<NetworkHosts> hosts_;
  std::vector<Pod> pods_;
  std::map<std::string, json> config_maps_;
  // name -> key -> content: the rendered Secrets (decoded), and those the test makes.
  std::map<std::string, std::map<std::string, std::string>> secrets_;
  std::vector<fs::path> made_dirs_;
};

TEST_P(PodsAsWrittenTest, TheOverlayServesTheGoldenIdsAsWritten) {
  fs::create_directories(image_bin_);
  absl::StatusOr<std::vector<json>> objects = Render(work_, GetParam());
  if (!objects.ok() && objects.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << objects.status();
  }
  ASSERT_TRUE(objects.ok()) << objects.status();

  // Objects by kind.
  std::vector<json> deployments, services;
  for (const json& o : *objects) {
    if (o["kind"] == "Deployment") deployments.push_back(o);
    if (o["kind"] == "Service") services.push_back(o);
    if (o["kind"] == "ConfigMap") config_maps_[o["metadata"]["name"]] = o.value("data", json::object());
    if (o["kind"] == "Secret") {
      const json data = o.value("data", json::object());
      for (const auto& [key, encoded] : data.items()) {
        std::string base64 = encoded.get<std::string>(), content;
        base64.erase(std::remove(base64.begin(), base64.end(), '\n'), base64.end());
        EXPECT_TRUE(absl::Base64Unescape(base64, &content)) << "Secret key " << key;
        secrets_[o["metadata"]["name"]][key] = content;
      }
    }
  }
  ASSERT_FALSE(deployments.empty());
  // components/mtls mounts the Secret estuary-cluster-tls, which an operator makes (cert-manager,
  // openssl): made here with openssl as deploy/README.md says.
  if (std::string(GetParam()).find("mtls") != std::string::npos) {
    absl::Status made = MakeClusterTlsSecret();
    if (made.code() == absl::StatusCode::kFailedPrecondition) GTEST_SKIP() << made;
    ASSERT_TRUE(made.ok()) << made;
  }
  std::vector<std::string> names;
  for (const json& d : deployments) {
    for (int r = 0; r < d["spec"].value("replicas", 1); ++r) {
      Pod pod;
      pod.name = absl::StrCat(d["metadata"]["name"].get<std::string>(), "-", r);
      pod.spec = d["spec"]["template"]["spec"];
      pod.labels = d["spec"]["template"]["metadata"]["labels"];
      pod.annotations = d["spec"]["template"]["metadata"].value("annotations", json::object());
      names.push_back(pod.name);
      pods_.push_back(std::move(pod));
    }
  }
  absl::StatusOr<std::unique_ptr<NetworkHosts>> hosts = NetworkHosts::Create(names);
  if (!hosts.ok() && hosts.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << hosts.status();
  }
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  hosts_ = std::move(*hosts);
  // No default route in the pods: the advertised address must come from POD_IP.
  for (const Pod& pod : pods_) {
    ASSERT_TRUE(RunProcess(hosts_->Command(pod.name, {"/usr/sbin/ip", "route", "del", "default"}))
                    .ok());
  }
  // Services: each name resolves to the pods its selector picks.
  std::vector<std::pair<std::string, std::vector<std::string>>> entries;
  for (const json& s : services) {
    std::vector<std::string> addresses;
    for (const Pod& pod : pods_) {
      if (Selects(s["spec"]["selector"], pod.labels)) addresses.push_back(hosts_->address(pod.name));
    }
    EXPECT_FALSE(addresses.empty()) << "Service " << s["metadata"]["name"] << " selects no pod";
    entries.push_back({s["metadata"]["name"], addresses});
  }
  ASSERT_TRUE(hosts_->SetHosts(entries).ok());
  // The image's binaries, copied (not linked): a pod's emptyDir on /tmp would hide a build
  // folder under /tmp.
  for (const char* binary : {"router/estuary-router", "prefill/estuary-prefill",
                             "decode/estuary-decode", "cli/estuary"}) {
    fs::copy_file(BinaryPath(binary), image_bin_ / fs::path(binary).filename());
  }
  fs::create_symlink("/bin/sleep", image_bin_ / "sleep");

  // Start every container as written.
  for (Pod& pod : pods_) {
    for (const json& c : pod.spec["containers"]) {
      std::vector<std::string> command = c.value("command", std::vector<std::string>{});
      ASSERT_FALSE(command.empty()) << pod.name << ": the image has no ENTRYPOINT: set command";
      for (const std::string& a : c.value("args", std::vector<std::string>{})) command.push_back(a);
      auto started = ChildProcess::Start(ContainerArgv(pod, c, command),
                                         (work_ / (pod.name + ".log")).string());
      ASSERT_TRUE(started.ok()) << started.status();
      pod.containers.push_back(std::move(*started));
    }
  }
  auto logs = [&] {
    std::string all;
    for (Pod& pod : pods_) {
      for (auto& c : pod.containers) absl::StrAppend(&all, "--- ", pod.name, ":\n", c->Log(), "\n");
    }
    return all;
  };

  // Probe like the kubelet: the startup probe within failureThreshold x periodSeconds, then
  // readiness (the routers need a ready decode worker) and liveness.
  for (Pod& pod : pods_) {
    const json& containers = pod.spec["containers"];
    for (size_t k = 0; k < containers.size(); ++k) {
      const json& c = containers[k];
      ChildProcess& container = *pod.containers[k];
      const std::string address = hosts_->address(pod.name);
      const Probe startup = ProbeOf(c, "startupProbe");
      WaitServing(container, pod.name + " startupProbe", address, startup,
                  absl::Seconds(startup.period_seconds * startup.failure_threshold));
      if (HasFatalFailure()) return;
      WaitServing(container, pod.name + " readinessProbe", address, ProbeOf(c, "readinessProbe"),
                  kLongestWaitHere);
      if (HasFatalFailure()) return;
      EXPECT_TRUE(ProbePasses(address, ProbeOf(c, "livenessProbe"))) << pod.name << " livenessProbe";
    }
  }

  // Under components/mtls a worker's gRPC port takes no client without a certificate: a
  // plaintext health check (what the kubelet's gRPC probe would send) gets no answer.
  if (std::string(GetParam()).find("mtls") != std::string::npos) {
    for (Pod& pod : pods_) {
      const std::string role = pod.labels.value("app.kubernetes.io/component", "");
      if (role != "prefill" && role != "decode") continue;
      const int grpc_port = PortOf(pod.spec["containers"][0], "grpc");
      EXPECT_FALSE(testing::CheckHealth(absl::StrCat(hosts_->address(pod.name), ":", grpc_port),
                                        "liveness", absl::Seconds(2))
                       .ok())
          << pod.name << ": its gRPC port answered a client without a certificate";
    }
  }

  // Every port a manifest names is one a process listens on: each containerPort, the port and
  // path Prometheus is told to scrape, each Service's targetPort.
  for (Pod& pod : pods_) {
    const std::string address = hosts_->address(pod.name);
    for (const json& c : pod.spec["containers"]) {
      for (const json& port : c.value("ports", json::array())) {
        EXPECT_TRUE(Listens(address, port["containerPort"].get<int>()))
            << pod.name << ": nothing listens on containerPort " << port;
      }
    }
    if (pod.annotations.value("prometheus.io/scrape", "") == "true") {
      const int port = std::stoi(pod.annotations.value("prometheus.io/port", "0"));
      httplib::Client scrape(address, port);
      scrape.set_connection_timeout(2);
      const httplib::Result got = scrape.Get(pod.annotations.value("prometheus.io/path", "/metrics"));
      ASSERT_TRUE(got) << pod.name << ": no answer to the scrape annotations' port " << port;
      EXPECT_EQ(got->status, 200) << pod.name;
      EXPECT_NE(got->body.find("estuary:"), std::string::npos) << pod.name << ": " << got->body;
    }
  }
  for (const json& s : services) {
    for (const Pod& pod : pods_) {
      if (!Selects(s["spec"]["selector"], pod.labels)) continue;
      for (const json& port : s["spec"]["ports"]) {
        const json& container = pod.spec["containers"][0];
        const int target = PortOf(container, port.value("targetPort", port["port"]));
        bool declared = false;
        for (const json& p : container.value("ports", json::array())) {
          declared = declared || p["containerPort"].get<int>() == target;
        }
        EXPECT_TRUE(declared) << "Service " << s["metadata"]["name"] << " targets port " << target
                              << ", which " << pod.name << " does not declare";
      }
    }
  }

  // Requests through the router Service's port (to each pod it selects, as a ClusterIP would).
  std::vector<std::string> router_addresses;
  for (const json& s : services) {
    if (s["metadata"]["name"] != "estuary-router") continue;
    const json& port = s["spec"]["ports"][0];
    for (const Pod& pod : pods_) {
      if (!Selects(s["spec"]["selector"], pod.labels)) continue;
      const int target = PortOf(pod.spec["containers"][0], port.value("targetPort", port["port"]));
      router_addresses.push_back(absl::StrCat(hosts_->address(pod.name), ":", target));
    }
  }
  ASSERT_FALSE(router_addresses.empty()) << "no estuary-router Service";
  const std::vector<testing::GoldenCase> cases = testing::LoadGoldenCases("stories260K");
  ASSERT_FALSE(cases.empty());
  for (size_t n = 0; n < cases.size(); ++n) {
    const std::string& router = router_addresses[n % router_addresses.size()];
    auto stub = estuary::v1::Inference::NewStub(
        grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
    const testing::Generated got = testing::Generate(
        *stub, testing::GreedyIds(cases[n].prompt_ids, testing::kGoldenMaxNewTokens));
    ASSERT_TRUE(got.status.ok()) << router << ": " << got.status.error_message() << "\n" << logs();
    EXPECT_EQ(got.ids, cases[n].completion_ids) << "case " << cases[n].index << " via " << router;
  }

  // Deletion as the kubelet does it: preStop, then SIGTERM, then the grace period.
  std::vector<std::thread> stops;
  for (Pod& pod : pods_) {
    stops.emplace_back([&, p = &pod] {
      const json& c = p->spec["containers"][0];
      const int grace = p->spec.value("terminationGracePeriodSeconds", 30);
      const absl::Time start = absl::Now();
      if (c.contains("lifecycle") && c["lifecycle"].contains("preStop")) {
        const std::vector<std::string> pre_stop = c["lifecycle"]["preStop"]["exec"]["command"];
        auto ran = RunProcess(ContainerArgv(*p, c, pre_stop), absl::Seconds(grace));
        EXPECT_TRUE(ran.ok() && ran->exit_code == 0)
            << p->name << " preStop: " << (ran.ok() ? ran->err : ran.status().ToString());
      }
      p->containers[0]->Signal(SIGTERM);
      auto exited = p->containers[0]->Wait(absl::Seconds(grace) - (absl::Now() - start));
      ASSERT_TRUE(exited.ok()) << p->name << " outlived terminationGracePeriodSeconds";
      EXPECT_EQ(*exited, 0) << p->name;
    });
  }
  for (std::thread& t : stops) t.join();
}

INSTANTIATE_TEST_SUITE_P(Overlays, PodsAsWrittenTest,
                         ::testing::Values("deploy/overlays/cpu-dev",
                                           "deploy/overlays/cpu-dev-mtls"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = fs::path(info.param).filename().string();
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace estuary
