// swift-tools-version: 6.1
// In-process benchmarks of the wormhole's own paths, with ordo-one's benchmark package, in a package of their own as
// swift-nio keeps its benchmarks: nothing a user of Wormhole resolves depends on it.
//
//     cd Benchmarks && swift package --allow-writing-to-package-directory benchmark
//
// The two-process comparisons (latency and throughput against ZeroMQ, Redis and hand-written floors) are
// `Benchmarks/compare` and `Benchmarks/ab`, which run the harness (`WormholeHarness bench-case`).
import PackageDescription

let package = Package(
    name: "WormholeBenchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "Wormhole", path: "../"),
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        .executableTarget(
            name: "WormholeBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "WormholeKit", package: "Wormhole"),
                .product(name: "WormholeTesting", package: "Wormhole"),
            ],
            path: "Benchmarks/WormholeBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        )
    ],
    swiftLanguageModes: [.v6]
)
