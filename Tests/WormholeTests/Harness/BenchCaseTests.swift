import Foundation
import Testing

/// The wormhole's side of `Benchmarks/compare` (`wormhole bench-case`), run small: every mode and metric completes
/// between two real processes and prints the line the comparison reads. No figure is checked: speed is measured by
/// the benchmark, not by tests.
@Suite("Comparison cases", .slow("the benchmark cases, run once each"), .limit(minutes: 2))
struct BenchCaseTests {
    let directory = TemporaryDirectory()

    @Test(
        "Each mode's latency and throughput case runs between two processes and prints its figures",
        arguments: [
            ("mailbox", "latency"), ("queue", "latency"), ("live", "latency"), ("mailbox", "throughput"),
            ("queue", "throughput"), ("queue-batch", "throughput"), ("live", "throughput"),
        ]
    )
    func runs(mode: String, metric: String) async throws {
        // A mailbox keeps the newest message: 300 passes can all be made before its listener first reads, leaving
        // one message and nothing to time.
        let count = mode == "mailbox" && metric == "throughput" ? 20_000 : 300
        try await offThePool {
            let result = try WormholeTool.run(
                [
                    "bench-case", mode, metric, "--count", String(count), "--warm-up", "20", "--size", "100",
                    "--directory", directory("\(mode)-\(metric)"),
                ],
                timeout: 60
            )
            #expect(result.status == 0, "\(result.error)")
            let line = try #require(result.lines.last)
            let figures = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            #expect(figures["case"] as? String == "wormhole-\(mode)")
            #expect(figures["metric"] as? String == metric)
            #expect(figures["size"] as? Int == 100)
            if metric == "latency" {
                #expect(figures["count"] as? Int == count)
                #expect((figures["percentiles_us"] as? [Double])?.count == 101)
                #expect((figures["p50_us"] as? Double ?? 0) > 0)
            } else {
                // Every message arrives, except on a mailbox, which keeps the newest (the last one always arrives).
                let received = figures["received"] as? Int ?? 0
                #expect(mode == "mailbox" ? received >= 2 : received == count)
                #expect((figures["messages_per_second"] as? Double ?? 0) > 0)
            }
        }
    }
}
