import Foundation
import GRDB
import Testing
import WormholeStore
import WormholeTesting

@testable import WormholeKit

/// What the engine seam changed for wormholes made from parts, the one listening vocabulary, and reposting.
@Suite("Engine seam and listening vocabulary", .limit(minutes: 3))
struct EngineSeamTests {
    let directory = TemporaryDirectory()

    @Test("A wormhole made from a file transiting and a notifier has every mode, in its directory")
    func partsOnADirectory() async throws {
        try await offThePool {
            let path = directory("parts")
            let wormhole = Wormhole(
                transiting: try CoordinatedFileTransiting(directory: path),
                notifier: try DirectoryNotifier(directory: path)
            )
            #expect(wormhole.directory == path)
            try wormhole.queue("jobs").enqueue("a job")
            #expect(try wormhole.queue("jobs").status().endOffset > 0)
            try wormhole.suite("settings").set(1, forKey: "count")
            #expect(try wormhole.suite("settings").value(forKey: "count", as: Int.self) == 1)
            // Another wormhole on the same directory sees the queue: the files are the same.
            let other = try Wormhole(directory: path)
            let consumer = Collector<String>()
            let handle = try other.queue("jobs").consume(consumer: "w", as: String.self, on: .notifierThread) {
                consumer.append($0.value)
            }
            #expect(eventually { consumer.values == ["a job"] })
            handle.cancel()
            #expect(handle.isCancelled)
        }
    }

    @Test("On a notifier of the app's own, an empty batch appends nothing and wakes no queue consumer")
    func emptyBatchWakesNobody() async throws {
        try await offThePool {
            let notifier = ManualNotifier()
            let wormhole = Wormhole(transiting: try FileTransiting(directory: directory("manual")), notifier: notifier)
            let queue = try wormhole.queue("jobs")
            try queue.enqueueData(contentsOf: [])
            #expect(notifier.postedNames.isEmpty)
            #expect(try queue.status().endOffset == 0)
            try queue.enqueue("a job")
            #expect(notifier.postedNames == ["queue.jobs"])
        }
    }

    @Test("A wormhole made from an in-memory transiting has mailboxes, and says what it cannot do")
    func partsWithoutADirectory() async throws {
        try await offThePool {
            let wormhole = Wormhole(transiting: InMemoryTransiting(), notifier: ManualNotifier())
            #expect(wormhole.directory == nil)
            try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
            #expect(try wormhole.message(withIdentifier: "button", as: Tap.self) == Tap(number: 1))
            for attempt in [
                { _ = try wormhole.queue("jobs") }, { _ = try wormhole.suite("settings") },
                { _ = try wormhole.transfers("files") }, { try wormhole.sendMessage(1, identifier: "live") },
            ] as [() throws -> Void] {
                let error = #expect(throws: WormholeError.self) { try attempt() }
                #expect(error?.code == .unsupported)
                #expect(error?.message.contains("Wormhole(engine:)") == true)
            }
        }
    }

    @Test("Mailbox messages are reposted to a NotificationCenter with the JSON object and the envelope")
    func reposting() async throws {
        try await offThePool {
            let engine = InMemoryEngine()
            let app = Wormhole(engine: engine, sender: "app")
            let widget = Wormhole(engine: engine, sender: "widget")
            let center = NotificationCenter()
            let received = Collector<Int>()
            let senders = Collector<String>()
            let token = center.addObserver(forName: Notification.Name("button"), object: nil, queue: nil) { note in
                if let object = note.object as? [String: Any], let number = object["number"] as? Int {
                    received.append(number)
                }
                if let envelope = note.userInfo?["envelope"] as? Envelope { senders.append(envelope.sender) }
            }
            defer { center.removeObserver(token) }
            let reposting = try widget.repostMessages(withIdentifier: "button", to: center)
            try app.passMessageObject(Tap(number: 7), identifier: "button")
            #expect(eventually { received.values == [7] && senders.values == ["app"] })
            reposting.cancel()
            try app.passMessageObject(Tap(number: 8), identifier: "button")
            (engine.notifier as? InMemoryNotifier)?.waitUntilIdle()
            #expect(received.values == [7], "nothing is reposted once cancelled")
        }
    }

    @Test("An error with no handler is logged, never dropped; a handler's own error is handlerFailed")
    func handlerFailedEverywhere() async throws {
        let engine = InMemoryEngine()
        let wormhole = Wormhole(engine: engine, sender: "app")
        let errors = Collector<WormholeError.Code>()
        struct Refused: Error {}
        let observer = try wormhole.suite("s").observe(includingOwnChanges: true, on: .notifierThread) { _ in }
        defer { observer.cancel() }
        // A suite update whose body throws its own error changes nothing and says so.
        let error = #expect(throws: WormholeError.self) {
            try wormhole.suite("s").update { values in
                try values.set(1, forKey: "k")
                throw Refused()
            }
        }
        #expect(error?.code == .handlerFailed)
        #expect(error?.underlyingError is Refused)
        #expect(try wormhole.suite("s").value(forKey: "k", as: Int.self) == nil)
        // A responder that throws: the requester gets remoteFailure, the responder's handler handlerFailed.
        let responder = try wormhole.respondToRequests(
            withIdentifier: "ask",
            as: Int.self,
            errorHandler: { errors.append($0.code) }
        ) { (_: Int) -> Int in throw Refused() }
        await #expect(throws: WormholeError.self) { _ = try await wormhole.request(1, identifier: "ask", as: Int.self) }
        #expect(await eventuallyAwaiting { errors.values == [.handlerFailed] })
        responder.cancel()
        #expect(responder.isCancelled)
    }

    @Test("The store's closures that throw are reported as handlerFailed and roll back")
    func storeHandlerFailed() async throws {
        try await offThePool {
            var migrator = DatabaseMigrator()
            migrator.registerMigration("items") { db in
                try db.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY)")
            }
            let store = try SharedStore(path: directory("store.sqlite"), migrator: migrator)
            struct Refused: Error {}
            let error = #expect(throws: StoreError.self) {
                try store.write { db in
                    try db.execute(sql: "INSERT INTO item DEFAULT VALUES")
                    throw Refused()
                }
            }
            #expect(error?.code == .handlerFailed)
            #expect(try store.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item") } == 0)
            #expect(try store.purgeHistory(maximumAge: .seconds(3600)) == 0)
        }
    }
}

@Suite("Incoming requests as a sequence", .limit(minutes: 3))
struct IncomingRequestsTests {
    @Test("incomingRequests: each request is answered from the loop; one dropped unanswered fails")
    func requestsAsASequence() async throws {
        let engine = InMemoryEngine()
        let server = Wormhole(engine: engine, sender: "server")
        let client = Wormhole(engine: engine, sender: "client")
        let requests = server.incomingRequests(withIdentifier: "echo")
        // The serving loop and this body run on threads of their own: on the cooperative pool they could wait for a
        // thread, while other suites' tests block theirs, longer than any time-out.
        let serving = Task(executorPreference: DedicatedThreadExecutor()) {
            var answered = 0
            for try await request in requests {
                answered += 1
                if answered == 2 { continue }  // dropped: its requester must fail at once, not at its time-out
                request.reply(Data(("echo " + String(decoding: request.payload, as: UTF8.self)).utf8))
                if answered == 3 { break }
            }
            return answered
        }
        // That a dropped request fails at once, not at its time-out, is the live contract's to check, on the
        // transport's threads; the time-outs here are generous.
        try await withTaskExecutorPreference(DedicatedThreadExecutor()) {
            try await exchange(client: client, serving: serving)
        }
    }

    private func exchange(client: Wormhole, serving: Task<Int, any Error>) async throws {
        let first = try await client.requestData(Data("one".utf8), identifier: "echo", timeout: .seconds(50))
        #expect(String(decoding: first, as: UTF8.self) == "echo one")
        let dropped = await #expect(throws: WormholeError.self) {
            _ = try await client.requestData(Data("two".utf8), identifier: "echo", timeout: .seconds(50))
        }
        #expect(dropped?.code == .remoteFailure)
        let third = try await client.requestData(Data("three".utf8), identifier: "echo", timeout: .seconds(50))
        #expect(String(decoding: third, as: UTF8.self) == "echo three")
        #expect(try await serving.value == 3)
    }
}
