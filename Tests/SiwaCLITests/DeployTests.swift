import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Synchronization
import Testing

/// What deployments rely on, with the real binary: the files in deploy/ as shipped, start-up exactly
/// as the systemd unit and the container run it, readiness, SIGTERM under load, several replicas on
/// one database, polling without LISTEN.
@Suite("Deployment: deploy/ files, start-up as shipped, readiness, SIGTERM, replicas", .timeLimit(.minutes(10)))
struct DeployTests {

    // MARK: Files

    @Test("Every YAML and JSON file in deploy/ parses; the manifests say what the deployment relies on")
    func filesParse() async throws {
        let files = try FileManager.default.subpathsOfDirectory(atPath: Repository.deploy.path).sorted()
        let yaml = files.filter { $0.hasSuffix(".yaml") || $0.hasSuffix(".yml") }
        #expect(yaml.count >= 12, "\(yaml)")
        // PyYAML (Debian's python3-yaml, or PyPI): the same parser family kubectl and compose accept.
        let script = """
            import json, sys, yaml
            out = {}
            for path in sys.argv[1:]:
                with open(path) as f:
                    out[path] = list(yaml.safe_load_all(f))
            print(json.dumps(out))
            """
        let parsed = try await Subprocess.run(
            "/usr/bin/env", ["python3", "-c", script] + yaml.map { Repository.deploy.appendingPathComponent($0).path }, environment: ProcessInfo.processInfo.environment)
        #expect(parsed.succeeded, "\(parsed.standardError)")
        let documents = try #require(JSONValue.parse(Array(parsed.standardOutput.utf8)))
        for file in files where file.hasSuffix(".json") {
            let data = try Data(contentsOf: Repository.deploy.appendingPathComponent(file))
            #expect(JSONValue.parse(Array(data)) != nil, "\(file) is not JSON")
        }
        func document(_ path: String, kind: String? = nil, name: String? = nil) -> JSONValue? {
            guard case .array(let list)? = documents[Repository.deploy.appendingPathComponent(path).path] else { return nil }
            return list.first { (kind == nil || $0["kind"] == .string(kind!)) && (name == nil || $0["metadata"]?["name"] == .string(name!)) }
        }

        // The compose stack's Prometheus configuration, with the rules it loads.
        let promtool = try await Subprocess.run(
            "/usr/bin/env", ["promtool", "check", "config", Repository.deploy.appendingPathComponent("prometheus/prometheus.yml").path],
            environment: ProcessInfo.processInfo.environment)
        #expect(promtool.succeeded, "\(promtool.combinedOutput)")
        #expect(promtool.combinedOutput.contains("alerts.yml"))
        // It scrapes the admin listeners (/metrics is not on the public port).
        let prometheus = try #require(documents[Repository.deploy.appendingPathComponent("prometheus/prometheus.yml").path]?.arrayValue?.first)
        let targets = (prometheus["scrape_configs"]?.arrayValue ?? []).flatMap { $0["static_configs"]?.arrayValue ?? [] }
            .flatMap { $0["targets"]?.arrayValue ?? [] }.compactMap(\.stringValue)
        #expect(targets.sorted() == ["receiver:8081", "worker:8081"], "\(targets)")

        // compose: receiver and workers as separate services after the migration, Prometheus with the rules.
        let compose = try #require(document("compose.yaml"))
        for service in ["postgres", "migrate", "receiver", "worker", "prometheus"] { #expect(compose["services"]?[service] != nil, "compose has no \(service)") }
        #expect(compose["services"]?["receiver"]?["environment"]?["SIWA_ROLE"] == .string("receiver"))
        #expect(compose["services"]?["worker"]?["environment"]?["SIWA_ROLE"] == .string("worker"))
        #expect(compose["services"]?["receiver"]?["environment"]?["SIWA_EMBEDDED_DATABASE"] == .string("off"))
        #expect(compose["services"]?["receiver"]?["depends_on"]?["migrate"]?["condition"] == .string("service_completed_successfully"))
        // Both listeners published on the host's loopback only; nothing else publishes siwa-events.
        #expect(compose["services"]?["receiver"]?["ports"] == .array([.string("127.0.0.1:8080:8080"), .string("127.0.0.1:8081:8081")]))
        for service in ["migrate", "worker"] { #expect(compose["services"]?[service]?["ports"] == nil, "compose publishes \(service)") }
        // Secrets are files (compose secrets under /run/secrets), never variables.
        for service in ["migrate", "receiver", "worker"] {
            #expect(compose["services"]?[service]?["environment"]?["DATABASE_URL_FILE"] == .string("/run/secrets/database-url"))
            #expect(compose["services"]?[service]?["environment"]?["DATABASE_URL"] == nil)
            #expect(compose["services"]?[service]?["secrets"] == .array([.string("database-url")]))
        }
        #expect(compose["secrets"]?["database-url"]?["file"] == .string("./secrets/database-url"))
        #expect(compose["services"]?["postgres"]?["environment"]?["POSTGRES_PASSWORD"] == nil)
        // The service role is not the image's superuser: the init script makes it (PostgresRoleScriptTests runs it).
        #expect(compose["services"]?["postgres"]?["environment"]?["POSTGRES_USER"] == .string("postgres"))
        #expect(compose["services"]?["postgres"]?["volumes"]?.arrayValue?.contains(
            .string("./postgres/create-service-role.sh:/docker-entrypoint-initdb.d/010-create-service-role.sh:ro")) == true)
        #expect(compose["services"]?["receiver"]?["environment"]?["SIWA_ADMIN_HOSTS"] == .string("localhost,receiver,worker"), "Prometheus scrapes receiver:8081")

        // Kubernetes: probes, non-root read-only containers, config from the ConfigMap and Secret.
        let config = try #require(document("kubernetes/configmap.yaml", kind: "ConfigMap"))
        #expect(config["data"]?["SIWA_EMBEDDED_DATABASE"] == .string("off"))
        #expect(config["data"]?["SIWA_MIGRATE_ON_START"] == .string("false"))
        #expect(config["data"]?["SIWA_PORT"] == .string("8080") && config["data"]?["SIWA_ADMIN_PORT"] == .string("8081"))
        #expect(config["data"]?["SIWA_ADMIN_HOST"] == .string("0.0.0.0"), "the PodMonitor scrapes the pod's IP")
        for (file, role) in [("kubernetes/receiver.yaml", "receiver"), ("kubernetes/worker.yaml", "worker")] {
            let deployment = try #require(document(file, kind: "Deployment"))
            let pod = try #require(deployment["spec"]?["template"]?["spec"])
            let container = try #require(pod["containers"]?.arrayValue?.first)
            #expect(pod["securityContext"]?["runAsNonRoot"] == .bool(true))
            #expect(container["securityContext"]?["readOnlyRootFilesystem"] == .bool(true))
            #expect(container["livenessProbe"]?["httpGet"]?["path"] == .string("/health/live"))
            #expect(container["readinessProbe"]?["httpGet"]?["path"] == .string("/health/ready"))
            #expect(container["resources"]?["requests"] != nil && container["resources"]?["limits"] != nil)
            #expect(container["env"]?.arrayValue?.first?["value"] == .string(role))
            #expect(container["envFrom"]?.arrayValue == [.object(["configMapRef": .object(["name": .string("siwa-events")])])], "\(file): secrets are files, not variables")
            // Probes on the public port; the admin port named for the PodMonitor.
            let ports = (container["ports"]?.arrayValue ?? []).map { ($0["name"]?.stringValue ?? "", $0["containerPort"]) }
            #expect(ports.map(\.0) == ["http", "admin"] && ports.map(\.1) == [.number(8080), .number(8081)], "\(file): \(ports)")
            #expect(container["readinessProbe"]?["httpGet"]?["port"] == .string("http"))
        }
        let job = document("kubernetes/migrate-job.yaml", kind: "Job")
        #expect(job?["spec"]?["template"]?["spec"]?["containers"]?.arrayValue?.first?["args"] == .array([.string("migrate")]))
        // The Secret is a read-only volume of every pod; the ConfigMap's *_FILE variables name its files.
        for (file, kind) in [("kubernetes/receiver.yaml", "Deployment"), ("kubernetes/worker.yaml", "Deployment"), ("kubernetes/migrate-job.yaml", "Job")] {
            let pod = try #require(document(file, kind: kind)?["spec"]?["template"]?["spec"])
            let volume = try #require(pod["volumes"]?.arrayValue?.first { $0["secret"] != nil }, "\(file) mounts no Secret")
            #expect(volume["secret"]?["secretName"] == .string("siwa-events"))
            let mount = try #require(pod["containers"]?.arrayValue?.first?["volumeMounts"]?.arrayValue?.first { $0["name"] == volume["name"] })
            #expect(mount["mountPath"] == .string("/run/secrets/siwa-events") && mount["readOnly"] == .bool(true), "\(file)")
            #expect(pod["securityContext"]?["fsGroup"] == .number(10001), "\(file): the pod's user reads the Secret's files")
        }
        #expect(config["data"]?["DATABASE_URL_FILE"] == .string("/run/secrets/siwa-events/database-url"))
        #expect(config["data"]?["SIWA_METRICS_TOKEN_FILE"] == .string("/run/secrets/siwa-events/metrics-token"))
        let secret = try #require(document("kubernetes/secret.example.yaml", kind: "Secret"))
        #expect(secret["stringData"]?["database-url"] != nil && secret["stringData"]?["metrics-token"] != nil)
        #expect(document("kubernetes/hpa.yaml", kind: "HorizontalPodAutoscaler", name: "siwa-events-receiver") != nil)
        #expect(document("kubernetes/hpa.yaml", kind: "HorizontalPodAutoscaler", name: "siwa-events-worker") != nil)
        #expect(document("kubernetes/pdb.yaml", kind: "PodDisruptionBudget") != nil)
        // /metrics is scraped on the admin port; the Service behind the Ingress has the public port
        // only, the admin listener a ClusterIP Service of its own.
        let podMonitor = try #require(document("kubernetes/podmonitor.yaml", kind: "PodMonitor"))
        #expect(podMonitor["spec"]?["podMetricsEndpoints"]?.arrayValue?.map { $0["port"] } == [.string("admin")])
        let publicService = try #require(document("kubernetes/service.yaml", kind: "Service", name: "siwa-events"))
        #expect(publicService["spec"]?["ports"]?.arrayValue?.map { $0["targetPort"] } == [.string("http")])
        let adminService = try #require(document("kubernetes/service.yaml", kind: "Service", name: "siwa-events-admin"))
        #expect(adminService["spec"]?["type"] == .string("ClusterIP"))
        #expect(adminService["spec"]?["ports"]?.arrayValue?.map { $0["targetPort"] } == [.string("admin")])
        // Every file kustomization.yaml lists exists.
        if case .array(let resources)? = document("kubernetes/kustomization.yaml")?["resources"] {
            for case .string(let resource) in resources {
                #expect(FileManager.default.fileExists(atPath: Repository.deploy.appendingPathComponent("kubernetes/\(resource)").path), "\(resource)")
            }
        } else {
            Issue.record("kustomization.yaml has no resources")
        }
    }

    /// The Dockerfile's build command and entrypoint, as written there.
    struct ContainerImage {
        var build: String
        var entrypoint: [String]
        var environment: [String: String]
        var healthcheck: [String]
        var exposed: [String]

        init(_ text: String) throws {
            // Continuation lines joined.
            let lines = text.replacingOccurrences(of: "\\\n", with: " ").split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
            build = try #require(lines.first { $0.hasPrefix("RUN swift build") }).dropFirst(4).trimmingCharacters(in: .whitespaces)
            func array(_ prefix: String) throws -> [String] {
                let line = try #require(lines.first { $0.hasPrefix(prefix) }, "no \(prefix) in the Dockerfile")
                let json = String(line[try #require(line.firstIndex(of: "["))...])
                guard case .array(let items)? = JSONValue.parse(Array(json.utf8)) else { throw ValidationFailure("\(prefix) is not an exec-form array") }
                return items.compactMap(\.stringValue)
            }
            entrypoint = try array("ENTRYPOINT") + array("CMD [")
            healthcheck = try array("HEALTHCHECK")
            exposed = lines.filter { $0.hasPrefix("EXPOSE ") }.flatMap { $0.dropFirst(7).split(separator: " ").map(String.init) }
            environment = [:]
            for line in lines where line.hasPrefix("ENV ") {
                for pair in line.dropFirst(4).split(separator: " ") where pair.contains("=") {
                    let parts = pair.split(separator: "=", maxSplits: 1)
                    environment[String(parts[0])] = String(parts[1])
                }
            }
        }
    }

    struct ValidationFailure: Error, CustomStringConvertible { var description: String; init(_ d: String) { description = d } }

    /// Reads the Dockerfile and compares it with the README; it builds no image (the suite needs
    /// no container daemon). That the binary starts with the image's entrypoint and environment
    /// is `startsAsShipped`.
    @Test("The Dockerfile's build command, entrypoint, environment, ports and healthcheck are the ones the README documents")
    func dockerfileMatchesDocs() async throws {
        let image = try ContainerImage(String(contentsOf: Repository.deploy.appendingPathComponent("Dockerfile"), encoding: .utf8))
        let readme = try String(contentsOf: Repository.root.appendingPathComponent("README.md"), encoding: .utf8)
        #expect(image.build == "swift build -c release --product siwa-events --static-swift-stdlib")
        #expect(readme.contains(image.build), "README does not document the image's build command: \(image.build)")
        #expect(image.entrypoint == ["/usr/local/bin/siwa-events", "serve"])
        #expect(readme.contains("siwa-events serve"))
        #expect(image.environment["SIWA_EMBEDDED_DATABASE"] == "off")
        #expect(image.healthcheck.contains("http://127.0.0.1:8080/health/ready"))
        // Public listener on 8080, admin on 8081 (reachable in the cluster network for scraping;
        // compose and Kubernetes decide who else reaches it).
        #expect(image.environment["SIWA_PORT"] == "8080" && image.environment["SIWA_ADMIN_PORT"] == "8081", "\(image.environment)")
        #expect(image.environment["SIWA_ADMIN_HOST"] == "0.0.0.0")
        #expect(image.exposed == ["8080", "8081"])
    }

    /// `KEY=value` lines of an environment file (comments and blanks skipped).
    static func environmentFile(_ text: String) -> [String: String] {
        var values: [String: String] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") && line.contains("=") {
            let parts = line.split(separator: "=", maxSplits: 1)
            values[String(parts[0]).trimmingCharacters(in: .whitespaces)] = String(parts[1])
        }
        return values
    }

    @Test("The binary starts as the systemd unit and the container entrypoint start it (same arguments and environment), gets ready, and refuses to start without DATABASE_URL")
    func startsAsShipped() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let databaseURL = try await TestBinary.databaseURL()
        // Only what must differ on this machine: the database, Apple's keys (no internet), the ports.
        let local = ["SIWA_APPLE_JWKS_URL": keys.jwksURL, "SIWA_APPLE_BUNDLE_IDS": keys.aud]

        // systemd: ExecStart's arguments, EnvironmentFile's variables (the shipped example).
        let unit = try String(contentsOf: Repository.deploy.appendingPathComponent("systemd/siwa-events.service"), encoding: .utf8)
        let execStart = try #require(unit.split(separator: "\n").first { $0.hasPrefix("ExecStart=") }).dropFirst("ExecStart=".count).split(separator: " ").map(String.init)
        #expect(execStart.first == "/usr/local/bin/siwa-events")
        #expect(unit.contains("DynamicUser=yes") && unit.contains("ProtectSystem=strict") && unit.contains("EnvironmentFile=/etc/siwa-events/siwa-events.env"))
        let envFile = Self.environmentFile(try String(contentsOf: Repository.deploy.appendingPathComponent("systemd/siwa-events.env.example"), encoding: .utf8))
        #expect(envFile["SIWA_EMBEDDED_DATABASE"] == "off")
        // Both listeners on loopback: the proxy on the host reaches the public one, nobody else.
        #expect(envFile["SIWA_HOST"] == "127.0.0.1" && envFile["SIWA_ADMIN_HOST"] == "127.0.0.1" && envFile["SIWA_ADMIN_PORT"] == "8081")
        // Secrets are credentials (LoadCredential=, in the directory %d names), not in the environment file.
        #expect(Settings.all.filter(\.secret).allSatisfy { envFile[$0.variable] == nil }, "\(envFile)")
        let credentials = try TestBinary.makeDirectory("credentials")
        defer { try? FileManager.default.removeItem(atPath: credentials) }
        var unitEnvironment: [String: String] = [:]
        for line in unit.split(separator: "\n") where line.hasPrefix("Environment=") {
            let parts = line.dropFirst("Environment=".count).split(separator: "=", maxSplits: 1).map(String.init)
            unitEnvironment[parts[0]] = parts[1].replacingOccurrences(of: "%d", with: credentials)
        }
        #expect(unit.contains("LoadCredential=database-url:/etc/siwa-events/database-url"))
        #expect(unitEnvironment == ["DATABASE_URL_FILE": "\(credentials)/database-url"], "\(unitEnvironment)")
        try Data((databaseURL + "\n").utf8).write(to: URL(fileURLWithPath: "\(credentials)/database-url"))

        // The container: ENTRYPOINT + CMD, the image's ENV, the ConfigMap's settings.
        let image = try ContainerImage(String(contentsOf: Repository.deploy.appendingPathComponent("Dockerfile"), encoding: .utf8))

        let isolated = ["PATH": "/usr/bin:/bin", "HOME": "/nonexistent"]  // no inherited SIWA_* or DATABASE_URL
        for (name, arguments, environment) in [
            ("systemd", Array(execStart.dropFirst()), envFile.merging(unitEnvironment) { $1 }),
            ("container", Array(image.entrypoint.dropFirst()), image.environment.merging(["DATABASE_URL": databaseURL]) { $1 }),
        ] {
            let serving = try await TestBinary.startServing(
                arguments, environment: isolated.merging(environment) { $1 }.merging(local) { $1 }, unsetting: { _ in true }, directory: "/tmp")
            let (server, port) = (serving.process, serving.port)
            if name == "container" {
                // The image's HEALTHCHECK command, pointed at this port.
                let check = image.healthcheck.dropFirst().map { $0.replacingOccurrences(of: ":8080/", with: ":\(port)/") }
                let result = try await Subprocess.run(TestBinary.url.path, Array(check), environment: isolated)
                #expect(result.succeeded, "healthcheck: \(result.combinedOutput)")
                #expect(result.standardOutput.contains(#""status":"ready""#))
            }
            server.signal(SIGTERM)
            #expect(await server.waitForExit() == 0, "\(name): exit status after SIGTERM")

            // Without DATABASE_URL: a clear refusal, never a private database.
            var missing = isolated.merging(environment) { $1 }.merging(local) { $1 }.merging(["SIWA_PORT": "0", "SIWA_ADMIN_PORT": "0"]) { $1 }
            missing["DATABASE_URL"] = nil
            missing["DATABASE_URL_FILE"] = nil
            let refused = try await Subprocess.run(TestBinary.url.path, arguments, environment: missing, workingDirectory: keys.directory)
            #expect(refused.status == 78, "\(name): \(refused.combinedOutput)")
            #expect(refused.standardError.contains("DATABASE_URL") && refused.standardError.contains("SIWA_EMBEDDED_DATABASE=off"), "\(refused.standardError)")
            #expect(!FileManager.default.fileExists(atPath: "\(keys.directory)/.siwa"), "\(name): a private database was started")
        }
    }

    // MARK: Readiness

    @Test("/health/ready follows PostgreSQL down and back without a restart; a worker is ready without Apple's keys, a receiver is not")
    func readinessFollowsDatabase() async throws {
        let directory = try TestBinary.makeDirectory("ready")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // log_connections: PostgreSQL logs each session it admits, the server's reconnect among them.
        let cluster = EmbeddedPostgres(
            options: .init(dataDirectory: "\(directory)/db", durable: false, extraSettings: ["log_connections": "on"]), logger: Logger(label: "ready"))
        let connection = try await cluster.start()
        let socketDirectory = (connection.socketPath as NSString).deletingLastPathComponent
        let url = "postgres://\(connection.username)@/\(connection.database)?host=\(socketDirectory)"
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }

        let base = ["DATABASE_URL": url, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL, "SIWA_DATABASE_TIMEOUT": "1s"]
        let serving = try await TestBinary.startServing(environment: base, directory: directory)
        let (server, port) = (serving.process, serving.port)

        // Stopped (pg_ctl waited for it): every ping fails from now on.
        try await cluster.stop()
        let down = await TestBinary.get(http, "http://127.0.0.1:\(port)/health/ready")
        #expect(down?.status == 503 && down?.body.contains(#""database":"unreachable""#) == true, "\(down.map { "\($0.status) \($0.body)" } ?? "no answer")")
        #expect(await TestBinary.status(http, "http://127.0.0.1:\(port)/health/live") == 200)

        // The server's pool reconnects on its own: the event is PostgreSQL admitting its role again.
        let log = "\(directory)/db/postgres.log"
        let logged = try FileManager.default.attributesOfItem(atPath: log)[.size] as? UInt64 ?? 0
        _ = try await cluster.start()
        let (tail, restarted) = try ChildOutput.following(log, from: logged)
        let reconnected = await restarted.wait(for: "connection authorized: user=\(connection.username)", within: .seconds(30))
        tail.signal(SIGTERM)
        _ = await tail.waitForExit()
        #expect(reconnected, "the server did not reconnect within 30 s of PostgreSQL's restart: \(restarted.text.suffix(4000))")
        let up = await TestBinary.get(http, "http://127.0.0.1:\(port)/health/ready")
        #expect(up?.status == 200 && up?.body.contains(#""status":"ready""#) == true, "\(up.map { "\($0.status) \($0.body)" } ?? "no answer")")
        // Right after the outage the pool holds the one connection that came back: concurrent
        // queries must open more connections, not crash the process (postgres-nio asserts when
        // its minimum connections are not all open — the serving pool keeps its minimum at 1).
        let burst = await withTaskGroup(of: Int?.self) { group in
            for _ in 0..<48 { group.addTask { await TestBinary.status(http, "http://127.0.0.1:\(port)/health/ready") } }
            return await group.reduce(into: [Int?]()) { $0.append($1) }
        }
        #expect(burst.allSatisfy { $0 == 200 }, "statuses after the outage: \(burst)")
        server.signal(SIGTERM)
        let status = await server.waitForExit()
        _ = await serving.output.waitForEnd()
        let output = serving.output.text
        #expect(status == 0, "exit \(status); log: \(output.suffix(20000))")
        // A first start on an empty database: the workers wait for the migrations.
        #expect(output.contains("migration applied") && !output.contains("does not exist"), "\(output.prefix(5000))")

        // Apple's keys unreachable: a worker is ready (it never needs them), a receiver is not.
        let unreachable = base.merging(["SIWA_APPLE_JWKS_URL": "file://\(directory)/missing-jwks.json"]) { $1 }
        for (role, expected) in [("worker", 200), ("receiver", 503)] {
            let serving = try await TestBinary.startServing(["serve", "--role", role], environment: unreachable, directory: directory, ready: false)
            let (process, port) = (serving.process, serving.port)
            // A worker's readiness is its database, open before it listens; a receiver's keys
            // are unavailable once their first fetch has failed, which it logs.
            if role == "receiver" {
                let failed = await serving.output.wait(for: "apple keys unusable", within: .seconds(30))
                #expect(failed, "receiver: no 'apple keys unusable' within 30 s: \(serving.output.text.suffix(4000))")
            }
            let answer = await TestBinary.get(http, "http://127.0.0.1:\(port)/health/ready")
            #expect(answer?.status == expected, "\(role): /health/ready answered \(answer.map { "\($0.status) \($0.body)" } ?? "nothing"), not \(expected)")
            if role == "receiver" { #expect(answer?.body.contains(#""apple_keys":"unavailable""#) == true && answer?.body.contains(directory) == false, "\(answer?.body ?? "")") }
            process.signal(SIGTERM)
            #expect(await process.waitForExit() == 0)
        }
        try await http.shutdown()
        try await cluster.stop()
    }

    // MARK: SIGTERM, replicas, polling

    @Test("SIGTERM under load: every request gets a complete answer or is refused before it is read, every 200 is stored, no job is left held, exit 0 within the grace period")
    func sigtermUnderLoad() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let databaseURL = try await TestBinary.databaseURL()
        // A callback endpoint that accepts and never answers: deliveries are in hand (leased,
        // `running`) when the signal comes, and must be handed back.
        let endpoint = try await CallbackEndpoint.start(hang: true)
        let serving = try await TestBinary.startServing(environment: [
            "DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL,
            "SIWA_SHUTDOWN_GRACE": "10s", "SIWA_CALLBACK_URL": endpoint.url.absoluteString, "SIWA_CALLBACK_SECRET": TestWebhooks.secret, "SIWA_CALLBACK_TIMEOUT": "60s",
        ])
        let (server, port) = (serving.process, serving.port)
        let bodies = try keys.bodies(count: 3_000, prefix: "term")
        let load = DeliveryLoad(bodies: bodies, ports: [port])
        var exit: Task<(Int32, Duration), Never>?
        var held = 0
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await load.sendAll(senders: 16) }
            let reached = await load.answers.wait(until: 300)
            #expect(reached, "the load ended after \(load.answered) answers, before 300: \(load.failedBeforeSignal.prefix(3))")
            #expect(await endpoint.arrived.wait(until: 1), "no callback reached the endpoint before the signal")
            held = (try? await TestBinary.withDatabase(databaseURL) { client in
                try await TestBinary.count(client, "SELECT count(*) FROM jobs WHERE lane = 'callbacks' AND state = 'running'")
            }) ?? 0
            server.signal(SIGTERM)
            let terminatedAt = ContinuousClock.now
            exit = Task { (await server.waitForExit(), ContinuousClock.now - terminatedAt) }
            load.markSignalled()
            await group.waitForAll()
        }
        let (status, took) = await exit!.value
        await endpoint.stop()
        // Exit 0 is the proof it finished within SIWA_SHUTDOWN_GRACE (10 s): a shutdown cut short
        // exits 1 (ShutdownGraceTests). A wall-clock bound here would measure the machine.
        #expect(status == 0, "exit status \(status) after \(took)")
        #expect(load.incomplete.isEmpty, "answers cut short: \(load.incomplete.prefix(5))")
        #expect(load.failedBeforeSignal.isEmpty, "requests that failed before SIGTERM: \(load.failedBeforeSignal.prefix(5))")
        #expect(load.serverErrors.isEmpty, "5xx answers: \(load.serverErrors.prefix(5))")
        #expect(held > 0, "no delivery was in hand at the signal: the test would prove nothing")
        let acknowledged = load.acknowledged
        let refused = load.refusedAfterSignal
        #expect(acknowledged.count >= 300)
        try await TestBinary.withDatabase(databaseURL) { (client: PostgresClient) async throws in
            #expect(try await TestBinary.count(client, "SELECT count(*) FROM notifications WHERE jti = ANY(\(acknowledged))") == acknowledged.count)
            // Refused means not read: nothing of a request that got no answer was stored.
            #expect(try await TestBinary.count(client, "SELECT count(*) FROM notifications WHERE jti = ANY(\(refused))") == 0, "\(refused.prefix(5))")
            #expect(try await TestBinary.count(client, "SELECT count(*) FROM jobs WHERE state = 'running'") == 0)
            #expect(try await TestBinary.count(client, "SELECT count(*) FROM jobs WHERE lane = 'callbacks' AND state = 'available'") > 0)
        }
    }

    @Test("Two replicas on one database share the load; one is killed: nothing acknowledged is lost, nothing is applied twice")
    func twoReplicasOneKilled() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let databaseURL = try await TestBinary.databaseURL()
        let environment = ["DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL, "SIWA_JOB_LEASE": "2s"]
        let serving = [try await TestBinary.startServing(environment: environment), try await TestBinary.startServing(environment: environment)]
        let (replicas, ports) = (serving.map(\.process), serving.map(\.port))
        let bodies = try keys.bodies(count: 2_000, prefix: "replica", users: 200)
        // Senders alternate between the replicas; a request the killed one did not answer is sent
        // again to the other, as Apple retries.
        let load = DeliveryLoad(bodies: bodies, ports: ports, failover: true)
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await load.sendAll(senders: 16) }
            let reached = await load.answers.wait(until: 700)
            #expect(reached, "the load ended after \(load.answered) answers, before 700: \(load.answeredBy)")
            replicas[0].signal(SIGKILL)
            load.markSignalled()
            await group.waitForAll()
        }
        _ = await replicas[0].waitForExit()
        #expect(load.answeredBy[ports[0]] ?? 0 > 100 && load.answeredBy[ports[1]] ?? 0 > 100, "load was not spread: \(load.answeredBy)")
        let acknowledged = load.acknowledged
        #expect(acknowledged.count == bodies.count, "every notification acknowledged by one replica or the other")
        try await TestBinary.withDatabase(databaseURL) { client in
            // The survivor applies everything, including jobs the killed replica's transactions held (rolled back when it died).
            // Re-counted at each applied batch (its NOTIFY siwa_effects); the survivor takes the
            // killed replica's jobs once their 2 s lease runs out.
            let applied = try await DatabaseEvents.wait(client, on: "siwa_effects", within: .seconds(60)) {
                try await TestBinary.count(client, "SELECT count(*) FROM jobs WHERE lane = 'effects' AND state <> 'completed'") == 0
            }
            #expect(applied, "effect jobs still pending after 60 s")
            #expect(try await TestBinary.count(client, "SELECT count(*) FROM notifications WHERE jti = ANY(\(acknowledged)) AND status = 'applied'") == acknowledged.count)
            #expect(try await TestBinary.count(client, "SELECT count(*) FROM (SELECT job_id FROM job_attempts WHERE outcome = 'applied' GROUP BY job_id HAVING count(*) > 1) twice") == 0)
            #expect(try await TestBinary.count(client, "SELECT count(*) FROM job_attempts WHERE outcome = 'applied'") == bodies.count)
        }
        replicas[1].signal(SIGTERM)
        #expect(await replicas[1].waitForExit() == 0)
    }

    @Test("Polling only (SIWA_JOB_NOTIFY=off, as behind a transaction-mode pooler): a separate worker process applies what the receiver records, without LISTEN")
    func pollingOnlyWorker() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let databaseURL = try await TestBinary.databaseURL()
        let environment = ["DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL, "SIWA_JOB_NOTIFY": "off"]
        let receiving = try await TestBinary.startServing(["serve", "--role", "receiver"], environment: environment)
        let working = try await TestBinary.startServing(["serve", "--role", "worker"], environment: environment)
        let (receiver, worker, receiverPort) = (receiving.process, working.process, receiving.port)
        let load = DeliveryLoad(bodies: try keys.bodies(count: 40, prefix: "poll"), ports: [receiverPort])
        await load.send()
        #expect(load.acknowledged.count == 40)
        try await TestBinary.withDatabase(databaseURL) { client in
            // The worker does not LISTEN, but its batches still NOTIFY siwa_effects: the test listens.
            let applied = try await DatabaseEvents.count(client, "SELECT count(*) FROM notifications WHERE status = 'applied'", reaches: 40)
            #expect(applied == 40)
            #expect(try await TestBinary.count(client, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'") == 0)
        }
        for process in [receiver, worker] {
            process.signal(SIGTERM)
            #expect(await process.waitForExit() == 0)
        }
    }

    // MARK: doctor

    @Test("doctor: a wrong path and plain http fail; siwa-events serving TLS itself: an untrusted chain fails, a trusted one passes with its version, a near expiry warned")
    func doctor() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let serving = try await TestBinary.startServing(
            ["serve", "--role", "receiver"],
            environment: ["DATABASE_URL": try await TestBinary.databaseURL(), "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL])
        let (server, port) = (serving.process, serving.port)
        func doctor(_ arguments: [String]) async throws -> TestBinary.Run {
            try await TestBinary.run(["doctor"] + arguments + ["--timeout", "5s"], directory: keys.directory)
        }

        let route = try await doctor(["--url", "http://127.0.0.1:\(port)/apple/notifications"])
        #expect(route.stdout.contains("ok    route: POST /apple/notifications with a malformed notification → 400"), "\(route.stdout)")
        #expect(route.stdout.contains("FAIL  url: http://127.0.0.1:\(port)/apple/notifications is http://"), "\(route.stdout)")
        #expect(route.stdout.contains("warn  dns: 127.0.0.1 → 127.0.0.1: only private or loopback addresses"))
        #expect(route.status == 1)
        let wrongPath = try await doctor(["--url", "http://127.0.0.1:\(port)/notifications"])
        #expect(wrongPath.stdout.contains("FAIL  route: POST /notifications → 404"), "\(wrongPath.stdout)")
        let bad = try await doctor(["--url", "siwa.example.com/apple/notifications"])
        #expect(bad.status == 64 && bad.stderr.contains("--url"), "\(bad.stderr)")
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)

        // TLS against a local server with a self-signed certificate for localhost, 7 days left.
        let generated = try await Subprocess.run(
            "/usr/bin/env",
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "\(keys.directory)/tls.key", "-out", "\(keys.directory)/tls.pem",
             "-days", "7", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
            environment: ProcessInfo.processInfo.environment)
        #expect(generated.succeeded, "\(generated.combinedOutput)")
        // siwa-events serving HTTPS itself (SIWA_TLS_CERT_FILE / SIWA_TLS_KEY_FILE).
        let tlsSettings = [
            "DATABASE_URL": try await TestBinary.databaseURL(), "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL,
            "SIWA_TLS_CERT_FILE": "\(keys.directory)/tls.pem", "SIWA_TLS_KEY_FILE": "\(keys.directory)/tls.key",
        ]
        let tlsServing = try await TestBinary.startServing(["serve", "--role", "receiver"], environment: tlsSettings)
        let (tls, tlsPort) = (tlsServing.process, tlsServing.port)
        // Listening (logged once the listener is bound): the handshake is answered at once.
        let untrusted = try await doctor(["--url", "https://localhost:\(tlsPort)/apple/notifications"])
        #expect(untrusted.stdout.contains("FAIL  tls: handshake with localhost:\(tlsPort) failed"), "\(untrusted.stdout)")
        #expect(untrusted.status == 1)
        let trusted = try await doctor(["--url", "https://localhost:\(tlsPort)/apple/notifications", "--ca-file", "\(keys.directory)/tls.pem"])
        #expect(trusted.stdout.contains("ok    tls: TLS 1.3, certificate chain trusted for localhost"), "\(trusted.stdout)")
        #expect(trusted.stdout.contains("warn  tls: the certificate expires in"), "\(trusted.stdout)")
        #expect(trusted.stdout.contains("warn  tls: also trusting"))
        #expect(trusted.stdout.contains("ok    route: POST /apple/notifications with a malformed notification → 400"), "\(trusted.stdout)")
        #expect(trusted.status == 0, "only warnings: \(trusted.stdout)")
        tls.signal(SIGTERM)
        #expect(await tls.waitForExit() == 0)
        // Nothing listens there now: said for people first, the library's words after.
        let closed = try await doctor(["--url", "https://localhost:\(tlsPort)/apple/notifications"])
        #expect(closed.stdout.contains("FAIL  tls: cannot connect to localhost:\(tlsPort): the connection was refused: nothing listens on that port"), "\(closed.stdout)")

        // Half a TLS configuration is a configuration error naming what is missing.
        var half = ProcessInfo.processInfo.environment.merging(tlsSettings) { $1 }.merging(["SIWA_PORT": "0", "SIWA_ADMIN_PORT": "0"]) { $1 }
        half["SIWA_TLS_KEY_FILE"] = nil
        let refused = try await Subprocess.run(TestBinary.url.path, ["serve"], environment: half, workingDirectory: keys.directory)
        #expect(refused.status == 78 && refused.standardError.contains("SIWA_TLS_KEY_FILE"), "\(refused.combinedOutput)")
    }
}

/// Concurrent senders over a list of signed notifications: who answered what, and how.
final class DeliveryLoad: Sendable {
    let bodies: [(jti: String, body: String)]
    let ports: [Int]
    let failover: Bool
    private let state = Mutex(State())
    // A connection per sender (no request queues for one), and a short connect timeout: a request
    // for a connection the stopped server no longer accepts fails soon instead of AHC retrying
    // the connection for 10 s.
    private let http: HTTPClient = {
        var configuration = HTTPClient.Configuration(timeout: .init(connect: .seconds(2)))
        configuration.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 64)
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }()

    struct State {
        var next = 0
        var signalled = false
        var acknowledged: [String] = []
        var answeredBy: [Int: Int] = [:]
        var incomplete: [String] = []
        var failedBeforeSignal: [String] = []
        var refusedAfterSignal: [String] = []
        var serverErrors: [String] = []
    }

    /// Answers so far, to wait on.
    let answers = Progress()

    init(bodies: [(jti: String, body: String)], ports: [Int], failover: Bool = false) {
        self.bodies = bodies
        self.ports = ports
        self.failover = failover
    }

    deinit { try? http.syncShutdown() }

    var answered: Int { state.withLock { $0.answeredBy.values.reduce(0, +) } }
    var acknowledged: [String] { state.withLock { $0.acknowledged } }
    var answeredBy: [Int: Int] { state.withLock { $0.answeredBy } }
    var incomplete: [String] { state.withLock { $0.incomplete } }
    var failedBeforeSignal: [String] { state.withLock { $0.failedBeforeSignal } }
    var serverErrors: [String] { state.withLock { $0.serverErrors } }
    var refusedAfterSignal: [String] { state.withLock { $0.refusedAfterSignal } }
    func markSignalled() { state.withLock { $0.signalled = true } }

    /// `senders` concurrent senders until the list is exhausted; then `answers` is closed.
    func sendAll(senders: Int) async {
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<senders { group.addTask { await self.send() } }
        }
        answers.close()
    }

    /// Sends until the list is exhausted; after the signal (without failover), stops at the first
    /// request the server no longer takes.
    func send() async {
        while let index = state.withLock({ state -> Int? in
            defer { state.next += 1 }
            return state.next < bodies.count ? state.next : nil
        }) {
            var attempt = 0
            while true {
                let port = ports[(index + attempt) % ports.count]
                switch await deliver(index, to: port) {
                case .answered: break
                case .refused where failover && attempt < 20:
                    attempt += 1
                    continue
                case .refused:
                    if !failover && state.withLock({ $0.signalled }) { return }
                }
                break
            }
        }
    }

    enum Outcome { case answered, refused }

    private func deliver(_ index: Int, to port: Int) async -> Outcome {
        let (jti, body) = bodies[index]
        var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)/apple/notifications")
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.body = .bytes(ByteBuffer(string: body))
        let response: HTTPClientResponse
        do {
            response = try await http.execute(request, timeout: .seconds(30))
        } catch {
            // No answer at all: refused or closed before the request was read.
            state.withLock {
                if $0.signalled { $0.refusedAfterSignal.append(jti) } else { $0.failedBeforeSignal.append("\(jti): \(error)") }
            }
            return .refused
        }
        guard let answer = try? await response.body.collect(upTo: 1 << 16) else {
            state.withLock { $0.incomplete.append("\(jti): status \(response.status.code), body cut") }
            return .answered
        }
        let text = String(buffer: answer)
        state.withLock { state in
            state.answeredBy[port, default: 0] += 1
            if response.status == .ok && (text.contains(#""status":"accepted""#) || text.contains(#""status":"duplicate""#)) {
                state.acknowledged.append(jti)
            } else if response.status.code >= 500 {
                state.serverErrors.append("\(jti): \(response.status.code) \(text)")
            }
        }
        answers.add()
        return response.status.code >= 500 && failover ? .refused : .answered
    }
}
