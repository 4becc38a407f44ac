import Foundation
import Testing
import WormholeKit

/// Resources over time, measured in child processes so that other tests do not disturb the figures.
@Suite("Resources", .slow("loads of thousands of identifiers and messages"), .limit(minutes: 3))
struct ResourceTests {
    let directory = TemporaryDirectory()
    var location: [String] { ["--directory", directory("wormhole")] }

    @Test("Listening and stopping 10,000 times leaves the open descriptors where they were")
    func listenChurn() async throws {
        try await offThePool {
            let result = try WormholeTool.run(
                ["exercise", "listen-churn", "--count", "10000"] + location,
                timeout: 150
            )
            #expect(result.status == 0, "\(result.error)")
            let counts = result.lines.last?.split(separator: " ").dropFirst().compactMap { Int($0) } ?? []
            #expect(counts.count == 2 && counts[0] == counts[1], "\(result.output)")
        }
    }

    @Test("With inotify exhausted, a listener process falls back to polling, says so, and misses nothing")
    func inotifyExhausted() async throws {
        try await offThePool {
            try expectPollingListener(environment: ["WORMHOLE_TEST_INOTIFY_EXHAUSTED": "1"])
        }
    }

    @Test(
        "With inotify's real limits at 0 (a user namespace), listeners fall back to polling and miss nothing",
        .linuxOnly("inotify and user namespaces are Linux's"),
        .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare"), "needs unshare"),
        arguments: ["max_inotify_instances", "max_inotify_watches"]
    )
    func inotifyLimits(limit: String) async throws {
        try await offThePool {
            // In a user namespace of its own the listener's inotify limits can be set; 0 makes inotify_init1 (or
            // inotify_add_watch) fail as on a machine whose limits are used up. The script then runs the tool.
            #if os(Linux) || os(Android)
            let script = "echo 0 > /proc/sys/user/\(limit) && exec \"$0\" \"$@\""
            #else
            let script = "exit 1"  // inotify is Linux's; the test is disabled elsewhere
            #endif
            try expectPollingListener(launcher: [
                "/usr/bin/unshare", "--user", "--map-root-user", "/bin/sh", "-c", script,
            ])
        }
    }

    /// A listener process that cannot use inotify receives three passes by polling, and says that it polls.
    private func expectPollingListener(environment: [String: String] = [:], launcher: [String] = []) throws {
        let listener = try RunningTool(
            ["listen"] + location + ["button", "--count", "3", "--timeout", "60"],
            environment: environment,
            launcher: launcher
        )
        #expect(listener.waitUntilListening())
        let wormhole = try Wormhole(directory: directory("wormhole"))
        for number in 1...3 {
            try wormhole.passMessageObject(number, identifier: "button")
            #expect(eventually { listener.outputLines.count == number })
        }
        let result = listener.finish()
        #expect(result.status == 0, "\(result.error)")
        #expect(result.lines == ["1", "2", "3"])
        #expect(result.error.contains("polling for changes instead"), "the fallback is logged: \(result.error)")
    }

    @Test("A soak of 200,000 mailbox passes and 200,000 queue messages keeps memory bounded")
    func soak() async throws {
        try await offThePool {
            let result = try WormholeTool.run(
                ["exercise", "soak", "--count", "200000", "--identifier", "soak"] + location,
                timeout: 170
            )
            #expect(result.status == 0, "\(result.error)")
            let fields = Dictionary(
                uniqueKeysWithValues: (result.lines.last ?? "").split(separator: " ").dropFirst().compactMap {
                    field -> (String, Int)? in
                    let parts = field.split(separator: "=")
                    return parts.count == 2 ? (String(parts[0]), Int(parts[1]) ?? -1) : nil
                }
            )
            #expect(fields["last"] == 199_999)
            #expect(fields["queue"] == 200_000, "every queue message arrived")
            #expect((fields["mailbox"] ?? 0) >= 1)
            // Nothing is kept per message: the peak stays far below what holding 200,000 messages would take. (Under a
            // sanitizer, its shadow memory and quarantine dominate: the bound is not checked then.)
            if ProcessInfo.processInfo.environment["WORMHOLE_SANITIZER"] == nil {
                #expect((fields["peak-rss-kib"] ?? .max) < 150 * 1024, "\(result.output)")
            }
        }
    }
}

@Suite("Load", .slow("loads of thousands of identifiers and messages"), .limit(minutes: 5))
struct LoadTests {
    let directory = TemporaryDirectory()
    var location: [String] { ["--directory", directory("wormhole")] }

    @Test("16 processes listening to 1,000 identifiers each all end with the latest value of every identifier")
    func sixteenProcesses() async throws {
        try await offThePool {
            let listeners = try (0..<16).map { _ in
                try RunningTool(["exercise", "load-listen", "--count", "1000", "--tag", "2"] + location)
            }
            for listener in listeners { #expect(eventually(timeout: 120) { listener.outputLines.first == "ready" }) }
            let writer = try WormholeTool.run(
                ["exercise", "load-write", "--count", "1000", "--tag", "2"] + location,
                timeout: 240
            )
            #expect(writer.status == 0, "\(writer.error)")
            for listener in listeners {
                let result = listener.finish(timeout: 240)
                #expect(result.status == 0, "\(result.error)")
                #expect(result.lines.last?.hasPrefix("complete 1000 ") == true, "\(result.output)")
            }
        }
    }
}
