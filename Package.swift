// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "Wormhole",
    platforms: [.macOS(.v15), .iOS(.v18), .watchOS(.v11), .tvOS(.v18), .visionOS(.v2)],
    products: [
        // The library: mailboxes between processes that share a directory.
        .library(name: "WormholeKit", targets: ["WormholeKit"]),
        // A shared SQLite database (GRDB) whose commits reach every other process, with history.
        .library(name: "WormholeStore", targets: ["WormholeStore"]),
        // Test doubles for users' own tests: an in-memory transiting and a manual notifier.
        .library(name: "WormholeTesting", targets: ["WormholeTesting"]),
        // Every mode across hosts, on a PostgreSQL server the user already runs (postgres-nio).
        .library(name: "WormholePostgres", targets: ["WormholePostgres"]),
        // The command-line tool: the user's commands and the demo. (The harness is a target no product names.)
        .executable(name: "wormhole", targets: ["WormholeCommand"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-system.git", from: "1.8.1"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        // SHA-256 for the PostgreSQL engine's sealed notifications; postgres-nio depends on it already.
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
    ],
    targets: [
        // CRC-32C in hardware, and the few Linux calls that Glibc does not import (eventfd, renameat2, hole punching).
        .target(name: "CWormholeSystem"),
        .target(
            name: "WormholeKit",
            dependencies: [
                "CWormholeSystem",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(name: "WormholeTesting", dependencies: ["WormholeKit"]),
        // GRDB stays out of WormholeKit: only the store, its tests and the tool depend on it.
        .target(
            name: "WormholeStore",
            dependencies: [
                "WormholeKit",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // postgres-nio stays out of WormholeKit: only this engine, its tests and the tool depend on it.
        .target(
            name: "WormholePostgres",
            dependencies: [
                "WormholeKit",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOFoundationCompat", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // What the tool and the harness share: where a command's wormhole lives, output, child processes.
        .target(
            name: "WormholeCLI",
            dependencies: [
                "WormholeKit",
                "WormholeStore",
                "WormholePostgres",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "WormholeCommand",
            dependencies: [
                "WormholeKit",
                "WormholeStore",
                "WormholePostgres",
                "WormholeCLI",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The harness of the tests, scripts/crash-test and the benchmarks: crash tests, load exercises, benchmark
        // cases. No product names it, so nothing a user installs carries it.
        .target(name: "CWormholeHarness"),
        // The power-loss explorer's model: a system-call trace read into file operations, and the states a power cut
        // may leave of them. Used by the harness and the tests only.
        .target(name: "WormholeCrashStates"),
        .executableTarget(
            name: "WormholeHarness",
            dependencies: [
                "WormholeKit",
                "WormholeStore",
                "WormholeCLI",
                "WormholePostgres",
                "WormholeCrashStates",
                .target(name: "CWormholeHarness", condition: .when(platforms: [.linux, .android])),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The entry points of fuzzing every decoder of on-disk and on-wire bytes, for the fuzzer and the corpus test;
        // no product names it, so no user's build carries it.
        .target(name: "WormholeFuzzing", dependencies: ["WormholeKit", "WormholePostgres"]),
        // The fuzzer: `scripts/fuzz` builds it with libFuzzer.
        .executableTarget(name: "WormholeFuzz", dependencies: ["WormholeFuzzing"]),
        // One test target, its folders mirroring the modules. It depends on the tool and the harness so that both are
        // built for the tests to run.
        .testTarget(
            name: "WormholeTests",
            dependencies: [
                "WormholeKit", "WormholeTesting", "WormholeStore", "WormholeCLI", "WormholeFuzzing", "WormholeCommand",
                "WormholeHarness", "WormholePostgres", "WormholeCrashStates",
                "CWormholeSystem",
                .product(name: "GRDB", package: "GRDB.swift"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)

// The documentation plugin, only when building the docs (WORMHOLE_DOCS=1, as `scripts/docs` sets it), so that it stays
// out of the dependency graph of the package's users.
if Context.environment["WORMHOLE_DOCS"] != nil {
    package.dependencies.append(.package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"))
}

// Every public type says whether it is Sendable, as swift-log requires of its own (C targets take no Swift flags).
for target in package.targets where !target.name.hasPrefix("C") {
    target.swiftSettings = (target.swiftSettings ?? []) + [.unsafeFlags(["-Xfrontend", "-require-explicit-sendable"])]
}
