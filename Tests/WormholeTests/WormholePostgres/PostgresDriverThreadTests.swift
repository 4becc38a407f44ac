import Foundation
import Testing
import WormholeCLI
import WormholeKit
import WormholePostgres

/// On PostgreSQL, a live endpoint's envelopes are handled on a thread of its own, a callback driver: the default
/// execution runs the listener's callbacks there, and a callback that blocks has that thread's work taken over.
@Suite(
    "PostgreSQL engine: live callbacks on the endpoint's thread",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .enabled(if: LocalPostgresServer.unavailableReason() == nil, "PostgreSQL is not installed"),
    .limit(minutes: 2)
)
struct PostgresDriverThreadTests {
    @Test("Default callbacks run on the endpoint's thread, in order; one that blocks holds up no other listener")
    func inlineAndTakenOver() async throws {
        try await offThePool {
            let url = try requireTestServerURL()
            let engine = try PostgresEngine(url: url, group: uniqueGroup("driver"))
            defer { engine.close() }
            let wormhole = Wormhole(engine: engine, sender: "tests")
            let released = DispatchSemaphore(value: 0)
            let received = Collector<(Int, String)>()
            let listener = try wormhole.listenForLiveMessages(withIdentifier: "tick", as: Int.self) { number in
                // Message 20 waits until every message was sent; another listener is not held up meanwhile.
                if number == 20 { _ = released.wait(timeout: .now() + 60) }
                received.append((number, currentThreadName()))
            }
            for number in 0..<20 {
                _ = try wormhole.sendMessage(number, identifier: "tick")
                #expect(eventually(timeout: 10) { received.values.last?.0 == number })
            }
            let other = Collector<Int>()
            let otherListener = try wormhole.listenForLiveMessages(withIdentifier: "tock", as: Int.self) {
                other.append($0)
            }
            for number in 20..<60 { _ = try wormhole.sendMessage(number, identifier: "tick") }
            _ = try wormhole.sendMessage(1, identifier: "tock")
            #expect(eventually(timeout: 10) { other.count == 1 }, "another listener is not held up")
            #expect(received.count == 20, "the 20th still blocks")
            released.signal()
            #expect(eventually(timeout: 30) { received.count == 60 })
            let values = received.values
            #expect(values.map(\.0) == Array(0..<60), "each once, in order")
            // A callback held up past the watchdog's limit by a busy machine moves the listener to its queue for
            // good: so some, not every one, of the first 20 is asserted to have run inline.
            #expect(values.prefix(20).contains { $0.1 == "wh-pg-listen" }, "threads: \(Set(values.map(\.1)))")
            _ = (listener, otherListener)
        }
    }
    @Test("Requests that came before a responder was cancelled, and were not handled yet, fail at once")
    func queuedRequestsAnsweredOnCancel() async throws {
        let url = try requireTestServerURL()
        let engine = try PostgresEngine(url: url, group: uniqueGroup("driver"))
        defer { engine.close() }
        let wormhole = Wormhole(engine: engine, sender: "tests")
        let started = DispatchSemaphore(value: 0)
        let released = DispatchSemaphore(value: 0)
        // On the endpoint's thread, not timed (a .notifierThread callback): the requests after the first wait in the
        // endpoint's inbox while it is held.
        let responder = try wormhole.respondToRequestData(withIdentifier: "slow", on: .notifierThread) { payload in
            started.signal()
            _ = released.wait(timeout: .now() + 30)
            return payload
        }
        let first = Task { try await wormhole.requestData(Data("1".utf8), identifier: "slow", timeout: .seconds(30)) }
        try await blocking { #expect(started.wait(timeout: .now() + 10) == .success) }
        let queued = (2...3).map { number in
            Task { try await wormhole.requestData(Data("\(number)".utf8), identifier: "slow", timeout: .seconds(30)) }
        }
        try await Task.sleep(for: .milliseconds(500))  // the two reach the endpoint's inbox
        responder.cancel()
        released.signal()
        #expect(try await first.value == Data("1".utf8), "the one under way is answered")
        for request in queued {
            let error = await #expect(throws: WormholeError.self) { try await request.value }
            #expect(error?.code == .remoteFailure, "failed, not left to time out: \(String(describing: error))")
        }
    }
}
