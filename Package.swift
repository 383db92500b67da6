// swift-tools-version:6.1
import PackageDescription

// Shared settings for every target, in the spirit of Hummingbird's Package.swift.
let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

// What every test target on a real database, server or binary uses.
let integrationTestDependencies: [Target.Dependency] = [
    .product(name: "ServiceLifecycleTestKit", package: "swift-service-lifecycle"),
    .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
    .product(name: "Hummingbird", package: "hummingbird"),
    .product(name: "AsyncHTTPClient", package: "async-http-client"),
    .product(name: "PostgresNIO", package: "postgres-nio"),
    .product(name: "NIOCore", package: "swift-nio"),
    .product(name: "NIOHTTP1", package: "swift-nio"),
    .product(name: "Logging", package: "swift-log"),
    .product(name: "Crypto", package: "swift-crypto"),
]

let package = Package(
    name: "siwa-events",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "siwa-events", targets: ["SiwaCLI"]),
        .executable(name: "siwa-bench", targets: ["SiwaBench"]),
    ],
    dependencies: [
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        // Already in the graph through Hummingbird; named because the connection guard reads HTTP parts.
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.7.1"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        // Already in the graph through async-http-client; named because `doctor` inspects a TLS handshake
        // and `serve` can terminate TLS itself (HummingbirdTLS).
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        // Already in the graph through jwt-kit; named because the verifier calls RSA directly.
        .package(url: "https://github.com/apple/swift-crypto.git", "4.1.0"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        // Already in the graph through Hummingbird; named for the settings' ConfigReader (environment
        // and command-line providers; the latter sits behind this trait).
        .package(url: "https://github.com/apple/swift-configuration", from: "1.4.0", traits: ["CommandLineArguments"]),
    ],
    targets: [
        // Rules only: notification model and decoding, verification, durations. No I/O.
        .target(
            name: "SiwaDomain",
            dependencies: [
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        // Runtime helpers: deadlines, doorbells, the start gate, and the scheduler every loop runs on.
        .target(
            name: "SiwaRuntime",
            dependencies: [
                "SiwaDomain",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // Every SQL statement, the migrator, record + enqueue, rejections, key-set persistence.
        .target(
            name: "SiwaStore",
            dependencies: [
                "SiwaDomain", "SiwaRuntime",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            resources: [.embedInCode("Migrations")],
            swiftSettings: swiftSettings
        ),
        // Everything that talks to Apple: its JWKS (fetch, cache, persist, refresh; a Service),
        // /auth/token and /auth/revoke, the client secrets they need.
        .target(
            name: "SiwaApple",
            dependencies: [
                "SiwaDomain", "SiwaRuntime",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // A local stand-in for Apple's auth endpoints (/auth/token, /auth/revoke): codes, ES256 client
        // secrets checked as Apple checks them, recorded revocations (a Service; `standin serve`, tests).
        .target(
            name: "SiwaAppleStandIn",
            dependencies: [
                "SiwaDomain",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // The private PostgreSQL cluster used when no DATABASE_URL is given (a Service).
        .target(
            name: "SiwaEmbeddedPostgres",
            dependencies: [
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // Effect workers, queue maintenance (Services with runOnce).
        .target(
            name: "SiwaWorkers",
            dependencies: [
                "SiwaApple", "SiwaDomain", "SiwaRuntime", "SiwaStore",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                // The endpoint probe's TLS handshake (doctor and the background endpoint check).
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // Hummingbird routes, error -> JSON mapping, the receiver.
        .target(
            name: "SiwaHTTP",
            dependencies: [
                "SiwaDomain", "SiwaRuntime", "SiwaStore", "SiwaApple",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            // The API's contract, served at /openapi.yaml (the tests hold the server to it).
            // and the dashboard's static files (served at /, /app.js, /app.css).
            resources: [.embedInCode("openapi.yaml"), .embedInCode("Web/index.html"), .embedInCode("Web/app.js"), .embedInCode("Web/app.css")],
            swiftSettings: swiftSettings
        ),
        // Composition root: validated Configuration + the service group (tests build it too).
        .target(
            name: "SiwaApp",
            dependencies: [
                "SiwaDomain", "SiwaRuntime", "SiwaStore", "SiwaApple", "SiwaHTTP", "SiwaEmbeddedPostgres", "SiwaWorkers",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Configuration", package: "swift-configuration"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "SiwaCLI",
            dependencies: [
                "SiwaApp", "SiwaDomain", "SiwaHTTP", "SiwaApple", "SiwaStore", "SiwaWorkers", "SiwaAppleStandIn",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: swiftSettings
        ),
        // Load generator: signed notifications over real HTTP to a running server.
        .executableTarget(
            name: "SiwaBench",
            dependencies: [
                "SiwaDomain", "SiwaRuntime",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: swiftSettings
        ),
        // Test-only helpers: throwaway clusters, per-test databases, an Apple-style signer.
        .target(
            name: "SiwaTestSupport",
            dependencies: [
                "SiwaDomain", "SiwaRuntime", "SiwaStore", "SiwaApple", "SiwaEmbeddedPostgres", "SiwaApp", "SiwaHTTP", "SiwaWorkers",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "SiwaDomainTests",
            dependencies: ["SiwaDomain"],
            swiftSettings: swiftSettings
        ),
        // The runtime helpers: deadlines, the doorbell, the start gate, the loop scheduler.
        .testTarget(
            name: "SiwaRuntimeTests",
            dependencies: [
                "SiwaRuntime",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "ServiceLifecycleTestKit", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // Client secrets, and /auth/token and /auth/revoke through real HTTP to a local server.
        .testTarget(
            name: "SiwaAppleTests",
            dependencies: [
                "SiwaApple", "SiwaDomain", "SiwaTestSupport",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        // Statements, the queue, migrations and upgrades, the embedded cluster: on real PostgreSQL.
        .testTarget(
            name: "SiwaStoreTests",
            dependencies: [
                "SiwaTestSupport", "SiwaRuntime", "SiwaStore", "SiwaDomain", "SiwaEmbeddedPostgres", "SiwaApp", "SiwaWorkers", "SiwaApple",
            ] + integrationTestDependencies,
            swiftSettings: swiftSettings
        ),
        // The loops, driven by runOnce: effects, callbacks, alerts, key refresh, restarts.
        .testTarget(
            name: "SiwaWorkersTests",
            dependencies: [
                "SiwaTestSupport", "SiwaRuntime", "SiwaWorkers", "SiwaStore", "SiwaDomain", "SiwaApple", "SiwaAppleStandIn", "SiwaApp", "SiwaEmbeddedPostgres",
                .product(name: "Prometheus", package: "swift-prometheus"),
            ] + integrationTestDependencies,
            swiftSettings: swiftSettings
        ),
        // The HTTP layer and the composition root, through real HTTP: receiver, API, metrics, dashboard
        // (sign-in completion against the stand-in for Apple's auth endpoints, in process).
        .testTarget(
            name: "SiwaAppTests",
            dependencies: [
                "SiwaTestSupport", "SiwaRuntime", "SiwaApp", "SiwaHTTP", "SiwaStore", "SiwaDomain", "SiwaApple", "SiwaWorkers", "SiwaEmbeddedPostgres",
                "SiwaAppleStandIn",
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ] + integrationTestDependencies,
            swiftSettings: swiftSettings
        ),
        // The stand-in for Apple's auth endpoints, through real HTTP: each rule of Apple's wire format.
        .testTarget(
            name: "SiwaAppleStandInTests",
            dependencies: ["SiwaAppleStandIn", "SiwaTestSupport", "SiwaDomain"] + integrationTestDependencies,
            swiftSettings: swiftSettings
        ),
        // The real binary: commands, deployment as shipped, SIGTERM and SIGKILL, proxies.
        .testTarget(
            name: "SiwaCLITests",
            dependencies: [
                "SiwaTestSupport", "SiwaRuntime", "SiwaApp", "SiwaDomain", "SiwaStore", "SiwaEmbeddedPostgres", "SiwaApple",
            ] + integrationTestDependencies,
            swiftSettings: swiftSettings
        ),
    ]
)
