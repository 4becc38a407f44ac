import Benchmark
import Foundation
import WormholeKit
import WormholeTesting

/// A small `Codable` message, as an app passes to its widget.
struct Tap: Codable, Sendable {
    var number: Int
    var label: String
}

/// A directory for the directory engine's benchmarks: in /dev/shm where there is one, so that the figures are the
/// wormhole's, not the disk's.
func benchmarkDirectory(_ name: String) -> String {
    let parent = FileManager.default.fileExists(atPath: "/dev/shm") ? "/dev/shm" : NSTemporaryDirectory()
    return parent + "/wormhole-benchmark-\(ProcessInfo.processInfo.processIdentifier)-" + name
}

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .mallocCountTotal, .instructions],
        maxDuration: .seconds(2),
        maxIterations: 100_000
    )

    // The baseline each figure is read against: encoding and decoding alone.
    Benchmark("JSON coding of a small message") { benchmark in
        let coder = JSONMessageCoder()
        for index in benchmark.scaledIterations {
            let data = try coder.encode(Tap(number: index, label: "button"))
            blackHole(try coder.decode(Tap.self, from: data))
        }
    }

    Benchmark("mailbox pass and read, in-memory engine") { benchmark in
        let wormhole = Wormhole(engine: InMemoryEngine())
        for index in benchmark.scaledIterations {
            try wormhole.passMessageObject(Tap(number: index, label: "button"), identifier: "button")
            blackHole(try wormhole.message(withIdentifier: "button", as: Tap.self))
        }
    }

    Benchmark("mailbox pass and read, directory engine") { benchmark in
        let path = benchmarkDirectory("mailbox")
        defer { try? FileManager.default.removeItem(atPath: path) }
        let wormhole = try Wormhole(directory: path)
        for index in benchmark.scaledIterations {
            try wormhole.passMessageObject(Tap(number: index, label: "button"), identifier: "button")
            blackHole(try wormhole.message(withIdentifier: "button", as: Tap.self))
        }
    }

    Benchmark("queue enqueue of one message, directory engine") { benchmark in
        let path = benchmarkDirectory("queue")
        defer { try? FileManager.default.removeItem(atPath: path) }
        let queue = try Wormhole(directory: path).queue("jobs")
        let payload = Data(repeating: 7, count: 64)
        for _ in benchmark.scaledIterations {
            try queue.enqueueData(payload)
        }
    }

    Benchmark("suite set with 1,000 keys, directory engine") { benchmark in
        let path = benchmarkDirectory("suite")
        defer { try? FileManager.default.removeItem(atPath: path) }
        let suite = try Wormhole(directory: path).suite("settings")
        try suite.update { values in
            for key in 0..<1000 { try values.set(key, forKey: "key\(key)") }
        }
        for index in benchmark.scaledIterations {
            try suite.set(index, forKey: "key\(index % 1000)")
        }
    }
}
