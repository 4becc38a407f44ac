import Foundation
import GRDB
import Logging
import PostgresNIO
import Synchronization
import Testing
import WormholeKit
import WormholePostgres
import WormholeStore
import WormholeTesting

/// Every Swift code example of the documentation, as written there: the DocC articles (`Sources/*/*.docc/*.md`) and
/// the examples in doc comments (`/// ```swift` blocks in `Sources`), so that the build checks that each compiles.
///
/// Each example is a function named after where it comes from; a comment above it gives the file. What an example
/// assumes (a `wormhole`, a type such as `Tap` or `Job`, a function such as `perform`) comes in as a parameter or is
/// declared below; what it makes is returned, so that the tests at the end can check it. Only the lines marked
/// `// (not in the docs)` are not part of the example. When you change an example here, change it in its file too.
enum DocumentationExamples {
    // MARK: What the examples assume

    struct Tap: Codable, Sendable { var number: Int }
    struct Job: Codable, Sendable { var id: Int }
    struct Settings: Codable, Sendable { var theme: String }
    struct Query: Codable, Sendable { var term: String }
    struct Answer: Codable, Sendable { var count: Int }

    /// A user-interface label, as `label` is in the examples.
    @MainActor final class Label {
        var text: String?
    }

    // MARK: - WormholeKit.docc/GettingStarted.md

    // Sources/WormholeKit/WormholeKit.docc/GettingStarted.md, "Choose a directory"; the same example opens
    // "Creating a wormhole" in Sources/WormholeKit/WormholeKit.docc/MigratingFromMMWormhole.md.
    // Compile-only: it makes the directory of the group under the user's app-groups directory.
    static func gettingStartedChooseADirectory() throws -> Wormhole {
        let wormhole = try Wormhole(applicationGroupIdentifier: "group.com.example.app", optionalDirectory: "wormhole")
        return wormhole  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/GettingStarted.md, "Pass and read".
    static func gettingStartedPassAndRead(wormhole: Wormhole) throws -> Int? {
        struct Tap: Codable, Sendable { var number: Int }

        try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
        let tap = try wormhole.message(withIdentifier: "button", as: Tap.self)  // Tap(number: 1), or nil if empty
        return tap?.number  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/GettingStarted.md, "Listen".
    static func gettingStartedListen(wormhole: Wormhole) throws -> MessageListener {
        let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) { tap in
            print("tapped", tap.number)
        }
        return listener  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/GettingStarted.md, "Test your code".
    static func gettingStartedTestYourCode() throws -> (ManualNotifier, MessageListener) {
        let notifier = ManualNotifier()
        let wormhole = Wormhole(engine: InMemoryEngine(notifier: notifier))
        let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self, on: .notifierThread) {
            tap in
            print("tapped", tap.number)
        }
        try wormhole.passMessageObject(Tap(number: 2), identifier: "button")
        notifier.deliverPendingNotifications()  // the listener runs now, on this thread
        return (notifier, listener)  // (not in the docs)
    }

    // MARK: - WormholeKit.docc/OnApplePlatforms.md

    // Sources/WormholeKit/WormholeKit.docc/OnApplePlatforms.md, "Overview".
    // Compile-only: it makes the directory of the group under the user's app-groups directory.
    static func onApplePlatformsOverview() throws -> Wormhole {
        let wormhole = try Wormhole(applicationGroupIdentifier: "group.com.example.app", optionalDirectory: "wormhole")
        try wormhole.passMessageObject(Tap(number: 12), identifier: "button")
        return wormhole  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/OnApplePlatforms.md, "Finishing a write in the background", the last
    // example. (The one before it calls UIKit, which this machine cannot compile; `suspend()` and
    // `waitUntilLocksAreReleased(atMost:)`, its calls of the package, are the ones here.)
    // Compile-only: suspension is process-wide, and the tests of this process run side by side (SuspensionTests runs
    // it in a child process instead).
    static func onApplePlatformsSuspension(wormhole: Wormhole) async throws -> Bool {
        Wormhole.suspend()
        do {
            try wormhole.passMessageObject("late", identifier: "status")
        } catch WormholeError.Code.suspended {
            // Nothing was written: pass it again after resuming.
        }
        let released = await Wormhole.waitUntilLocksAreReleased(atMost: .seconds(2))
        Wormhole.resume()
        return released  // (not in the docs)
    }

    // MARK: - WormholeKit.docc/Listening.md

    // Sources/WormholeKit/WormholeKit.docc/Listening.md, "As an AsyncSequence".
    // Compile-only: the loop listens until its task is cancelled.
    static func listeningAsAnAsyncSequence(wormhole: Wormhole, label: Label) {
        Task { @MainActor in
            for try await tap in wormhole.messages(withIdentifier: "button", as: Tap.self) {
                label.text = "\(tap.number)"
            }
        }
    }

    // Sources/WormholeKit/WormholeKit.docc/Listening.md, "As an AsyncSequence", with NotifierTaskExecutor.
    // Compile-only, as above; InlineCallbackTests runs the same loop.
    static func listeningOnTheNotifierExecutor(wormhole: Wormhole) {
        Task(executorPreference: NotifierTaskExecutor()) {
            for try await tap in wormhole.messages(withIdentifier: "button", as: Tap.self) {
                print("tapped", tap.number)
            }
        }
    }

    // Sources/WormholeKit/Listening/NotifierTaskExecutor.swift, the type's doc comment.
    // Compile-only.
    static func notifierTaskExecutorDocComment() throws {
        let wormhole = try Wormhole(applicationGroupIdentifier: "group.com.example.app")
        let reader = Task(executorPreference: NotifierTaskExecutor()) {
            for try await tap in wormhole.messages(withIdentifier: "button", as: Tap.self) {
                print("tapped", tap.number)  // on the notifier's thread, or this executor's queue
            }
        }
        reader.cancel()  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Listening.md, "Catching up".
    static func listeningCatchingUp(
        wormhole: Wormhole,
        apply: @escaping @Sendable (Settings) -> Void
    ) throws -> MessageListener {
        let listener = try wormhole.listenForMessage(
            withIdentifier: "settings",
            as: Settings.self,
            deliveringCurrentMessage: true
        ) { settings in apply(settings) }
        return listener  // (not in the docs)
    }

    // MARK: - WormholeKit.docc/DurableQueues.md

    // Sources/WormholeKit/WormholeKit.docc/DurableQueues.md, "When a mailbox is not enough".
    static func durableQueuesEnqueue(wormhole: Wormhole) throws -> WormholeQueue {
        struct Job: Codable, Sendable { var id: Int }

        let jobs = try wormhole.queue("jobs")
        try jobs.enqueue(Job(id: 1))  // any number of producers, in any number of processes
        return jobs  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/DurableQueues.md, "Consuming".
    static func durableQueuesConsume(
        jobs: WormholeQueue,
        perform: @escaping @Sendable (Job) throws -> Void
    ) throws -> QueueConsumer {
        let worker = try jobs.consume(consumer: "worker", as: Job.self) { message in
            try perform(message.value)  // returning acknowledges it
        }
        return worker  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/DurableQueues.md, "Consuming" (the AsyncSequence form).
    // Compile-only: the loop waits for messages until its task is cancelled.
    static func durableQueuesConsumeAsASequence(
        jobs: WormholeQueue,
        perform: (Job) async throws -> Void
    ) async throws {
        for try await message in try await jobs.messages(consumer: "worker", as: Job.self) {
            try await perform(message.value)
        }
    }

    // Sources/WormholeKit/WormholeKit.docc/DurableQueues.md, "Delayed and expiring messages".
    static func durableQueuesSchedule(jobs: WormholeQueue, nineOClock: Date) throws {
        try jobs.enqueue(Job(id: 2), schedule: .after(.seconds(30)))  // not before 30 s from now
        try jobs.enqueue(Job(id: 3), schedule: .at(nineOClock).expiring(after: .seconds(600)))
    }

    // Sources/WormholeKit/Queue/QueueSchedule.swift, QueueSchedule; and WormholeQueue.enqueue(_:schedule:).
    static func queueScheduleExample(jobs: WormholeQueue, nineOClock: Date) throws {
        try jobs.enqueue(Job(id: 2), schedule: .after(.seconds(30)))
        try jobs.enqueue(Job(id: 3), schedule: .at(nineOClock).expiring(after: .seconds(600)))
    }

    // Sources/WormholeKit/WormholeKit.docc/DurableQueues.md, "Batches".
    static func durableQueuesBatches(
        jobs: WormholeQueue,
        pending: [Job],
        perform: @escaping @Sendable ([Job]) throws -> Void
    ) throws -> QueueConsumer {
        try jobs.enqueue(contentsOf: pending)  // one write; no other producer's message comes in between
        let worker = try jobs.consumeBatches(consumer: "worker", as: Job.self, maximumCount: 500) { batch in
            try perform(batch.map(\.value))  // returning acknowledges the whole batch, with one write
        }
        return worker  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/DurableQueues.md, "Retries and dead letters".
    static func durableQueuesRetries(
        jobs: WormholeQueue,
        perform: @escaping @Sendable (Job) throws -> Void
    ) throws -> QueueConsumer {
        let policy = QueueRetryPolicy(maximumAttempts: 3, firstDelay: .milliseconds(200))
        let worker = try jobs.consume(consumer: "worker", as: Job.self, retry: policy) { message in
            try perform(message.value)  // throwing fails attempt message.attempt
        }
        return worker  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/DurableQueues.md, "Retries and dead letters" (the dead letters).
    static func durableQueuesDeadLetters(jobs: WormholeQueue) throws {
        let dead = try jobs.deadLetters(consumer: "worker")
        for letter in try dead.list() {
            print(letter.offset, letter.attempts, letter.reason, letter.lastError)
        }
        try dead.requeue()  // offered to the consumer again, from attempt 1
    }

    // Sources/WormholeKit/Queue/QueueRetryPolicy.swift, QueueRetryPolicy.
    static func retryPolicyExample() -> [QueueRetryPolicy] {
        let policy = QueueRetryPolicy(maximumAttempts: 3, firstDelay: .milliseconds(200))
        let strict = QueueRetryPolicy.default.ordered(.strict)
        return [policy, strict]  // (not in the docs)
    }

    // Sources/WormholeKit/Queue/WormholeQueue.swift, process(consumer:as:retry:on:errorHandler:handler:).
    static func processExample(
        jobs: WormholeQueue,
        isOnline: @escaping @Sendable () -> Bool,
        perform: @escaping @Sendable (Job) throws -> Void
    ) throws -> QueueConsumer {
        let consumer = try jobs.process(consumer: "worker", as: Job.self) { message in
            guard isOnline() else { return .later(.seconds(30)) }
            try perform(message.value)
            return .done
        }
        return consumer  // (not in the docs)
    }

    // Sources/WormholeKit/Queue/WormholeDeadLetters.swift, WormholeDeadLetters.
    static func deadLettersExample(wormhole: Wormhole) throws {
        let dead = try wormhole.queue("jobs").deadLetters(consumer: "worker")
        for letter in try dead.list() {
            print(letter.offset, letter.attempts, letter.lastError)
        }
        try dead.requeue()  // each is offered to the consumer again, from attempt 1
    }

    // MARK: - WormholeKit.docc/SecurityAndFailures.md

    // Sources/WormholeKit/WormholeKit.docc/SecurityAndFailures.md, "Who may read and write".
    // Compile-only: it needs /run/my-daemon and a Unix group.
    static func securitySharedWithAGroup(gid: gid_t) throws -> Wormhole {
        var configuration = Wormhole.Configuration()
        configuration.fileOptions = .shared(withGroup: gid)  // the group's id, from getgrnam(3)
        let wormhole = try Wormhole(directory: "/run/my-daemon/wormhole", configuration: configuration)
        return wormhole  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/SecurityAndFailures.md, "A power cut".
    // Compile-only: it needs /var/lib/my-daemon.
    static func securitySynchronizedWrites() throws -> Wormhole {
        var configuration = Wormhole.Configuration()
        configuration.fileOptions.synchronizesWrites = true
        let wormhole = try Wormhole(directory: "/var/lib/my-daemon/wormhole", configuration: configuration)
        return wormhole  // (not in the docs)
    }

    // MARK: - WormholeKit.docc/LiveMessagesAndRequests.md

    // Sources/WormholeKit/WormholeKit.docc/LiveMessagesAndRequests.md, "Send and listen".
    static func liveSendAndListen(wormhole: Wormhole) throws -> (LiveListener, Int) {
        struct Cursor: Codable, Sendable {
            var x: Int
            var y: Int
        }

        // In the listening process; keep the listener: releasing it stops listening.
        let listener = try wormhole.listenForLiveMessages(withIdentifier: "cursor", as: Cursor.self) { cursor in
            print("cursor at", cursor.x, cursor.y)
        }

        // In any process of the group:
        let reached = try wormhole.sendMessage(Cursor(x: 10, y: 20), identifier: "cursor")  // how many processes
        return (listener, reached)  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/LiveMessagesAndRequests.md, "One identifier as a value"; the same example
    // opens WormholeLiveChannel's doc comment (Sources/WormholeKit/Live/WormholeLiveChannel.swift).
    static func liveChannel(wormhole: Wormhole) async throws -> (LiveListener, LiveListener, Int) {
        let cursor = try wormhole.live("cursor")
        let listener = try cursor.listen(as: Int.self) { position in print("at", position) }
        try cursor.send(42)  // to every process listening now; nothing is kept

        let lookup = try wormhole.live("lookup")
        let responder = try lookup.respond(as: String.self) { term in term.count }
        let length = try await lookup.request("swift", as: Int.self)
        return (listener, responder, length)  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/LiveMessagesAndRequests.md, "Send and listen" (nobody listening).
    static func liveNobodyListening(wormhole: Wormhole) {
        struct Cursor: Codable, Sendable {
            var x: Int
            var y: Int
        }

        do {
            try wormhole.sendMessage(Cursor(x: 10, y: 20), identifier: "cursor")
        } catch WormholeError.Code.notReachable {
            // Nobody listens for "cursor" right now; nothing was sent.
        } catch {
            print(error)
        }
    }

    // Sources/WormholeKit/WormholeKit.docc/LiveMessagesAndRequests.md, "Send and listen" (the AsyncSequence form).
    // Compile-only: the loop listens until its task is cancelled.
    static func liveMessagesAsASequence(wormhole: Wormhole) async throws {
        struct Cursor: Codable, Sendable {
            var x: Int
            var y: Int
        }

        for try await cursor in wormhole.liveMessages(withIdentifier: "cursor", as: Cursor.self) {
            print("cursor at", cursor.x, cursor.y)
        }
    }

    // Sources/WormholeKit/WormholeKit.docc/LiveMessagesAndRequests.md, "Requests and replies".
    static func liveRequestsAndReplies(wormhole: Wormhole) async throws -> (LiveListener, Int) {
        struct Query: Codable, Sendable { var term: String }
        struct Answer: Codable, Sendable { var count: Int }

        // In the process that knows the answer; keep the responder: releasing it stops answering.
        let counts = ["swift": 3, "wormhole": 1]
        let responder = try wormhole.respondToRequests(withIdentifier: "lookup", as: Query.self) { query in
            Answer(count: counts[query.term] ?? 0)
        }

        // In any process of the group:
        let answer = try await wormhole.request(
            Query(term: "swift"),
            identifier: "lookup",
            as: Answer.self,
            timeout: .seconds(1)
        )
        print(answer.count)  // 3
        return (responder, answer.count)  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/LiveMessagesAndRequests.md, "Requests and replies" (the outcomes).
    static func liveRequestOutcomes(wormhole: Wormhole) async {
        struct Query: Codable, Sendable { var term: String }
        struct Answer: Codable, Sendable { var count: Int }

        do {
            let answer = try await wormhole.request(Query(term: "swift"), identifier: "lookup", as: Answer.self)
            print(answer.count)
        } catch WormholeError.Code.notReachable {
            // Nobody answers "lookup": the app is not running.
        } catch WormholeError.Code.timedOut {
            // It is running, but did not answer within 5 seconds.
        } catch {
            print(error)  // remoteFailure: the responder failed; decodingFailed: the reply is not an Answer
        }
    }

    // MARK: - WormholeKit.docc/SharedSuites.md

    // Sources/WormholeKit/WormholeKit.docc/SharedSuites.md, "Set and read".
    static func sharedSuitesSetAndRead(wormhole: Wormhole) throws -> (String?, SuiteValues) {
        let settings = try wormhole.suite("settings")
        try settings.set("dark", forKey: "theme", direction: "app→widget")
        try settings.set(3, forKey: "count")

        let theme = try settings.value(forKey: "theme", as: String.self)  // "dark"; nil when not set
        let everything = try settings.snapshot()  // every key and value, read at once
        print(everything.keys, everything["count", as: Int.self] ?? 0)  // ["count", "theme"] 3
        try settings.removeValue(forKey: "count")
        return (theme, everything)  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/SharedSuites.md, "Update several keys at once".
    static func sharedSuitesUpdate(wormhole: Wormhole) throws {
        let settings = try wormhole.suite("settings")
        try settings.update(direction: "app→widget") { values in
            try values.set((values["count", as: Int.self] ?? 0) + 1, forKey: "count")
            try values.set("app", forKey: "updatedBy")
        }
    }

    // Sources/WormholeKit/WormholeKit.docc/SharedSuites.md, "Observe changes".
    static func sharedSuitesObserve(wormhole: Wormhole) throws -> SuiteObserver {
        let settings = try wormhole.suite("settings")
        let observer = try settings.observe(keys: ["theme"]) { change in
            print(change.keys, "changed by", change.sender, change.direction ?? "-")
            print(change.values["theme", as: String.self] ?? "removed")
        }  // keep `observer`: releasing it stops observing
        return observer  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/SharedSuites.md, "Observe changes" (the AsyncSequence form).
    // Compile-only: the loop observes until its task is cancelled.
    static func sharedSuitesChanges(wormhole: Wormhole) async throws {
        let settings = try wormhole.suite("settings")
        for try await change in settings.changes(keys: ["theme"], direction: "app→widget") {
            print(change.values["theme", as: String.self] ?? "removed")
        }
    }

    // Sources/WormholeKit/WormholeKit.docc/SharedSuites.md, "Repost to a NotificationCenter".
    static func sharedSuitesRepost(wormhole: Wormhole) throws -> (SuiteObserver, any NSObjectProtocol) {
        let settings = try wormhole.suite("settings")
        let observer = try settings.observe(keys: ["theme"], repostingTo: .default) { _ in }
        let token = NotificationCenter.default.addObserver(
            forName: Notification.Name("theme"),
            object: nil,
            queue: nil
        ) { notification in
            print("theme is now", notification.object ?? "removed")
        }
        return (observer, token)  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/SharedSuites.md, "Catching up".
    static func sharedSuitesCatchingUp(wormhole: Wormhole) throws -> SuiteObserver {
        let settings = try wormhole.suite("settings")
        let observer = try settings.observe(keys: ["theme"]) { change in
            print("theme is now", change.values["theme", as: String.self] ?? "removed")
        }
        print("theme is", try settings.value(forKey: "theme", as: String.self) ?? "not set")
        return observer  // (not in the docs)
    }

    // MARK: - WormholeKit.docc/FileTransfers.md

    // Sources/WormholeKit/WormholeKit.docc/FileTransfers.md, "Send".
    // Compile-only: it needs /tmp/report.pdf.
    static func fileTransfersSend(wormhole: Wormhole) throws {
        let exports = try wormhole.transfers("exports")
        let transfer = try exports.send(file: "/tmp/report.pdf", metadata: ["kind": "report"]) { progress in
            print(Int(progress.fraction * 100), "%")  // after each chunk copied
        }
        print("sent", transfer.id, transfer.name, transfer.size)
    }

    // Sources/WormholeKit/WormholeKit.docc/FileTransfers.md, "Receive".
    // Compile-only: it moves files into /home/me/inbox.
    static func fileTransfersReceive(wormhole: Wormhole) throws -> QueueConsumer {
        let exports = try wormhole.transfers("exports")
        let receiver = try exports.receive(consumer: "viewer", into: "/home/me/inbox") { file in
            print("received", file.transfer.name, "at", file.path, "from", file.transfer.sender)
        }  // keep `receiver`: releasing it stops receiving
        return receiver  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/FileTransfers.md, "Receive" (the AsyncSequence form).
    // Compile-only: it moves files into /home/me/inbox, until its task is cancelled.
    static func fileTransfersFiles(wormhole: Wormhole) async throws {
        let exports = try wormhole.transfers("exports")
        for try await file in exports.files(consumer: "viewer", into: "/home/me/inbox") {
            print("received", file.path)
        }
    }

    // Sources/WormholeKit/WormholeKit.docc/FileTransfers.md, "Cancel and list".
    // Compile-only: it needs /tmp/report.pdf.
    static func fileTransfersCancelAndList(wormhole: Wormhole) throws {
        let exports = try wormhole.transfers("exports")
        let transfer = try exports.send(file: "/tmp/report.pdf")
        print(try exports.pendingTransferIDs())  // sent and not yet received, nor cancelled
        if try exports.cancel(transfer.id) == false {
            print("too late: it was already received")
        }
    }

    // MARK: - WormholeKit.docc/Sessions.md

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "Overview".
    static func sessionsOverview(wormhole: Wormhole) throws -> (WormholeSession, WormholeSession) {
        // In the phone's process:
        let phone = try WormholeSession(wormhole: wormhole, name: "phone", counterpart: "watch")

        // In the watch's process, the same two names the other way round:
        let watch = try WormholeSession(wormhole: wormhole, name: "watch", counterpart: "phone")
        return (phone, watch)  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "Activation".
    static func sessionsActivation(wormhole: Wormhole) throws -> (WormholeSession, [SessionListener]) {
        let watch = try WormholeSession(wormhole: wormhole, name: "watch", counterpart: "phone")

        // Handlers first: what the phone sent while the watch was away is handed to them at activation.
        let contexts = watch.onApplicationContext { update in
            print("context", update.context, "changed", update.changedKeys)
        }
        let userInfo = watch.onUserInfo { transfer in
            print("user info", transfer.userInfo)
        }
        let states = watch.onActivationStateChange { state in
            print("the session is", state)
        }
        try watch.activate()
        // Keep `contexts`, `userInfo` and `states`: releasing a SessionListener removes its handler.
        return (watch, [contexts, userInfo, states])  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "Application context".
    static func sessionsApplicationContext(phone: WormholeSession, watch: WormholeSession) throws -> SessionListener {
        // The phone:
        try phone.updateApplicationContext(["face": "modular", "nextEvent": "standup at 9:10"])
        print(try phone.applicationContext)  // what the phone sent last

        // The watch:
        let faces = watch.onApplicationContext(keys: ["face"]) { update in
            print("the face is now", update.context["face"]?.stringValue ?? "none")
        }
        print(try watch.receivedApplicationContext)  // what the watch received last, activated or not
        return faces  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "Messages".
    static func sessionsMessages(
        phone: WormholeSession,
        watch: WormholeSession
    ) async -> (SessionListener, [String: JSONValue]?) {
        var received: [String: JSONValue]? = nil  // (not in the docs)

        // The watch answers, with a handler registered before activate():
        let replier = watch.onMessage { message in
            if message.expectsReply {
                message.reply(["pong": message.message["ping"] ?? nil])
            }
        }

        // The phone asks:
        do {
            let reply = try await phone.sendMessage(["ping": 1])
            print(reply["pong"]?.intValue ?? 0)  // 1
            received = reply  // (not in the docs)
        } catch WormholeError.Code.notReachable {
            // The watch's session is not activated now: a context, user info or a file would wait for it.
        } catch WormholeError.Code.counterpartUnknown {
            // The watch has never activated a session with the phone.
        } catch {
            print(error)  // notActivated, timedOut, remoteFailure, messageTooLarge
        }
        return (replier, received)  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "Messages" (WatchConnectivity's form).
    // Compile-only: its handlers run on the main queue, which the tests do not wait for.
    static func sessionsSendMessageWithHandlers(phone: WormholeSession) {
        phone.sendMessage(
            ["ping": 1],
            replyHandler: { reply in print("reply", reply) },
            errorHandler: { error in print("failed:", error.code) },
            on: .main  // where the handler runs; a serial queue of its own by default
        )
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "User info".
    static func sessionsUserInfo(
        phone: WormholeSession,
        watch: WormholeSession
    ) throws -> (SessionListener, SessionListener) {
        // The phone:
        let transfer = try phone.transferUserInfo(["steps": 4200])
        try phone.transferCurrentComplicationUserInfo(["heartRate": 72])  // replaces a current one not yet taken
        for outstanding in try phone.outstandingUserInfoTransfers {
            print(outstanding.id, outstanding.userInfo)
        }
        if try phone.cancelUserInfoTransfer(transfer) == false {
            print("too late: the watch has taken it")
        }
        let finished = phone.onUserInfoTransferFinished { delivered in
            print("the watch has", delivered.id)
        }

        // The watch:
        let steps = watch.onUserInfo { transfer in
            print(transfer.userInfo["steps"]?.intValue ?? 0, transfer.isCurrentComplicationInfo)
        }
        return (finished, steps)  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "Files".
    // Compile-only: it needs /tmp/workout.gpx.
    static func sessionsFiles(phone: WormholeSession, watch: WormholeSession) throws -> SessionListener {
        // The phone:
        let transfer = try phone.transferFile("/tmp/workout.gpx", metadata: ["kind": "workout"]) { progress in
            print(Int(progress.fraction * 100), "%")  // after each chunk copied
        }
        print(try phone.outstandingFileTransfers.map(\.id))
        try phone.cancelFileTransfer(transfer)  // false when the watch has taken it already

        // The watch:
        let files = watch.onFile { file in
            print(file.transfer.name, file.transfer.metadata, "at", file.path)
        }
        return files  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "Reachability".
    static func sessionsReachability(phone: WormholeSession) -> SessionListener {
        let reachability = phone.onReachabilityChange(on: .main) { reachable in
            print(reachable ? "the watch is there" : "the watch is away")
        }
        return reachability  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "As AsyncSequences".
    // Compile-only: the loop answers messages until the sequence ends, and the task is not kept.
    static func sessionsAsAsyncSequences(watch: WormholeSession) throws {
        let messages = watch.messages()  // registered now, before activate()
        try watch.activate()
        Task {
            for try await message in messages {
                if message.expectsReply { message.reply(["seen": true]) }
            }
        }
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "Errors".
    static func sessionsErrors(watch: WormholeSession) -> SessionListener {
        let errors = watch.onError { error in
            print("session:", error)
        }
        return errors  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "Across hosts".
    // Compile-only: it needs a PostgreSQL server at db.example.com.
    static func sessionsAcrossHosts() throws -> WormholeSession {
        // "WormholePostgres" in your target's dependencies, beside "WormholeKit".
        let engine = try PostgresEngine(url: "postgres://app@db.example.com/app", group: "group.com.example.app")
        let wormhole = Wormhole(engine: engine, sender: "phone")
        let phone = try WormholeSession(wormhole: wormhole, name: "phone", counterpart: "watch")
        return phone  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "MMWormhole's form".
    static func sessionsMMWormholeForm(
        wormhole: Wormhole,
        phone: WormholeSession
    ) throws -> (WormholeSession, Wormhole, MessageListener, Wormhole) {
        struct Tap: Codable, Sendable { var number: Int }

        // The watch: listeners first, then activate(), as MMWormhole's activateSessionListening asked.
        let session = try WormholeSession(wormhole: wormhole, name: "watch", counterpart: "phone")
        let taps = Wormhole(session: session, transitingType: .sessionContext)
        let listener = try taps.listenForMessage(withIdentifier: "button", as: Tap.self) { tap in
            print("tapped", tap.number)
        }
        try session.activate()

        // The phone, with its own session activated:
        let phoneTaps = Wormhole(session: phone, transitingType: .sessionContext)
        try phoneTaps.passMessageObject(Tap(number: 1), identifier: "button")
        return (session, taps, listener, phoneTaps)  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/Sessions.md, "Testing".
    static func sessionsTestingAMessageHandler() throws {
        // The handler under test, as the app gives it to onMessage:
        let answerPing: @Sendable (SessionMessage) -> Void = { message in
            message.reply(["pong": message.message["ping"] ?? nil])
        }

        // In the test:
        let answers = Mutex<[LiveAnswer]>([])
        answerPing(
            SessionMessage(message: ["ping": 1], sender: "phone", expectsReply: true) { answer in
                answers.withLock { $0.append(answer) }
            }
        )
        guard case .reply(let data)? = answers.withLock({ $0.first }) else {
            Issue.record("no reply")
            return
        }
        #expect(try JSONMessageCoder().decode([String: JSONValue].self, from: data) == ["pong": 1])
    }

    // MARK: - WormholeKit.docc/MigratingFromMMWormhole.md
    // ("Creating a wormhole" opens with the example of GettingStarted.md's "Choose a directory", above.)

    // Sources/WormholeKit/WormholeKit.docc/MigratingFromMMWormhole.md, "Creating a wormhole" (transiting types).
    // Compile-only: it makes the directory of the group under the user's app-groups directory.
    static func migratingCoordinated() throws -> Wormhole {
        // MMWormholeTransitingTypeCoordinatedFile:
        let configuration = Wormhole.Configuration(coordination: .coordinated)
        let wormhole = try Wormhole(
            applicationGroupIdentifier: "group.com.example.app",
            optionalDirectory: "wormhole",
            configuration: configuration
        )
        return wormhole  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/MigratingFromMMWormhole.md, "Creating a wormhole" (your own parts).
    // Compile-only: it needs /run/my-app.
    static func migratingOwnParts() throws -> Wormhole {
        let transiting = try CoordinatedFileTransiting(directory: "/run/my-app/wormhole")
        let notifier = try DirectoryNotifier(directory: "/run/my-app/wormhole")
        let wormhole = Wormhole(transiting: transiting, notifier: notifier)
        return wormhole  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/MigratingFromMMWormhole.md, "Passing, reading and clearing".
    static func migratingPassReadClear(wormhole: Wormhole) throws -> Int? {
        struct Tap: Codable, Sendable { var number: Int }

        try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
        let tap = try wormhole.message(withIdentifier: "button", as: Tap.self)  // nil when the mailbox is empty
        try wormhole.clearMessageContents(forIdentifier: "button")
        return tap?.number  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/MigratingFromMMWormhole.md, "Listening".
    static func migratingListen(wormhole: Wormhole) throws -> MessageListener {
        struct Tap: Codable, Sendable { var number: Int }

        let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self, on: .main) { tap in
            print("tapped", tap.number)
        }  // keep `listener`: releasing it stops listening
        return listener  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeKit.docc/MigratingFromMMWormhole.md, "Sessions".
    static func migratingSessions(wormhole: Wormhole) throws -> (WormholeSession, Wormhole, MessageListener) {
        struct Tap: Codable, Sendable { var number: Int }

        // The watch: listeners first, then activate(), as activateSessionListening asked.
        let session = try WormholeSession(wormhole: wormhole, name: "watch", counterpart: "phone")
        let taps = Wormhole(session: session, transitingType: .sessionContext)
        let listener = try taps.listenForMessage(withIdentifier: "button", as: Tap.self) { tap in
            print("tapped", tap.number)
        }
        try session.activate()
        return (session, taps, listener)  // (not in the docs)
    }

    // MARK: - WormholeKit.docc/TestingYourCode.md

    // Sources/WormholeKit/WormholeKit.docc/TestingYourCode.md, "Give your code a wormhole".
    static func testingGiveYourCodeAWormhole() throws {
        struct ScoreKeeper {
            let wormhole: Wormhole  // the app passes Wormhole(applicationGroupIdentifier:optionalDirectory:)
            func record(_ score: Int) throws { try wormhole.passMessageObject(score, identifier: "score") }
        }

        let engine = InMemoryEngine()
        let keeper = ScoreKeeper(wormhole: Wormhole(engine: engine, sender: "app"))
        let widget = Wormhole(engine: engine, sender: "widget")  // the other process, as the test sees it
        try keeper.record(3)
        #expect(try widget.message(withIdentifier: "score", as: Int.self) == 3)
    }

    // Sources/WormholeKit/WormholeKit.docc/TestingYourCode.md, "Every mode in memory".
    static func testingEveryModeInMemory() async throws {
        let engine = InMemoryEngine()
        let app = Wormhole(engine: engine, sender: "app")
        let widget = Wormhole(engine: engine, sender: "widget")

        // A queue: the widget consumes what the app enqueued.
        try app.queue("jobs").enqueue(Job(id: 1))
        let jobs = try await widget.queue("jobs").messages(consumer: "worker", as: Job.self)
        for try await job in jobs {
            #expect(job.value.id == 1 && job.sender == "app")
            try await jobs.acknowledge(job)
            break
        }

        // A suite: the app's change, as the widget reads it.
        try app.suite("settings").set("dark", forKey: "theme")
        #expect(try widget.suite("settings").value(forKey: "theme", as: String.self) == "dark")

        // A request: the widget answers, the app asks.
        let responder = try widget.respondToRequests(withIdentifier: "lookup", as: Query.self) { query in
            Answer(count: query.term.count)
        }
        let answer = try await app.request(Query(term: "swift"), identifier: "lookup", as: Answer.self)
        #expect(answer.count == 5)
        responder.cancel()
    }

    // Sources/WormholeKit/WormholeKit.docc/TestingYourCode.md, "Decide when listeners run".
    static func testingDecideWhenListenersRun() throws {
        let notifier = ManualNotifier()
        let engine = InMemoryEngine(notifier: notifier)
        let app = Wormhole(engine: engine, sender: "app")
        let widget = Wormhole(engine: engine, sender: "widget")

        let taps = Mutex<[Int]>([])
        let listener = try widget.listenForMessage(withIdentifier: "button", as: Tap.self, on: .notifierThread) { tap in
            taps.withLock { $0.append(tap.number) }
        }
        try app.passMessageObject(Tap(number: 1), identifier: "button")
        try app.passMessageObject(Tap(number: 2), identifier: "button")
        #expect(taps.withLock { $0 }.isEmpty)  // nobody was woken yet
        #expect(notifier.postedNames == ["mailbox.button", "mailbox.button"])

        notifier.deliverPendingNotifications()  // the listener runs now, on this thread
        #expect(taps.withLock { $0 } == [2])  // two passes, one wake-up: the newest message
        listener.cancel()
    }

    // Sources/WormholeKit/WormholeKit.docc/TestingYourCode.md, "Mailboxes alone".
    static func testingMailboxesAlone() throws {
        let wormhole = Wormhole(transiting: InMemoryTransiting(), notifier: ManualNotifier(deliversImmediately: true))
        try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
        #expect(try wormhole.message(withIdentifier: "button", as: Tap.self)?.number == 1)
        #expect(throws: WormholeError.self) { try wormhole.queue("jobs") }  // mailboxes only
    }

    // Sources/WormholeKit/WormholeKit.docc/TestingYourCode.md, "When to use the directory engine".
    static func testingDirectoryEngine() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(UUID().uuidString).path
        defer { try? FileManager.default.removeItem(atPath: directory) }

        let app = Wormhole(engine: try DirectoryEngine(directory: directory), sender: "app")
        let reader = try Wormhole(directory: directory)
        try app.passMessageObject(Tap(number: 1), identifier: "button")
        #expect(try reader.message(withIdentifier: "button", as: Tap.self)?.number == 1)
    }

    // MARK: - WormholeTesting.docc/WormholeTesting.md

    // Sources/WormholeTesting/WormholeTesting.docc/WormholeTesting.md, "Overview".
    static func wormholeTestingOverview() throws {
        let engine = InMemoryEngine()
        let app = Wormhole(engine: engine, sender: "app")
        let widget = Wormhole(engine: engine, sender: "widget")
        try app.suite("settings").set("dark", forKey: "theme")
        #expect(try widget.suite("settings").value(forKey: "theme", as: String.self) == "dark")
    }

    // MARK: - WormholeStore.docc/SharingAStore.md

    // Sources/WormholeStore/WormholeStore.docc/SharingAStore.md, "Open the store".
    // Compile-only: it makes the store under the user's app-groups directory.
    static func sharingAStoreOpen() throws -> SharedStore {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.create(table: "counter") { t in
                t.primaryKey("id", .integer)
                t.column("value", .integer).notNull()
            }
        }
        let store = try SharedStore(
            applicationGroupIdentifier: "group.com.example.app",
            name: "shared.sqlite",
            migrator: migrator,
            configuration: .init(author: "widget")
        )
        return store  // (not in the docs)
    }

    // Sources/WormholeStore/WormholeStore.docc/SharingAStore.md, "Receiving remote changes".
    // Compile-only: the loop waits for other processes' commits until its task is cancelled.
    static func sharingAStoreRemoteChanges(store: SharedStore) async throws {
        for try await transaction in store.remoteChanges(consumer: "widget", tables: ["counter"]) {
            // merge: reload the objects whose primary keys changed
            _ = transaction  // (not in the docs)
        }
    }

    // MARK: - README.md
    // (Only the example of "Sessions" under "Delivery modes"; the README's other examples are not mirrored here.)

    // README.md, "Delivery modes" (sessions).
    // Compile-only: the watch must be activated to reply.
    static func readmeSessions(wormhole: Wormhole) async throws -> (WormholeSession, [String: JSONValue]) {
        // The watch makes its own session, with the two names swapped.
        let phone = try WormholeSession(wormhole: wormhole, name: "phone", counterpart: "watch")
        try phone.activate()  // after its handlers: onMessage, onUserInfo…
        try phone.updateApplicationContext(["face": "modular"])  // the watch gets the newest, now or when it activates
        try phone.transferUserInfo(["steps": 4200])  // queued: in order, once, across restarts
        let reply = try await phone.sendMessage(["ping": 1])  // only while the watch is activated; else notReachable
        return (phone, reply)  // (not in the docs)
    }

    // MARK: - Doc comments of WormholeKit

    // Sources/WormholeKit/Wormhole.swift, `Wormhole`.
    // Compile-only: it makes the directory of the group under the user's app-groups directory. The same calls run
    // end to end through GettingStarted's examples below.
    static func wormholeOverview() throws -> (Int?, MessageListener) {
        struct Tap: Codable, Sendable { var number: Int }

        let wormhole = try Wormhole(applicationGroupIdentifier: "group.com.example.app", optionalDirectory: "wormhole")
        try wormhole.passMessageObject(Tap(number: 1), identifier: "button")

        // In another process:
        let tap = try wormhole.message(withIdentifier: "button", as: Tap.self)  // nil when the mailbox is empty
        let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) { tap in
            print("tapped", tap.number)
        }
        return (tap?.number, listener)  // (not in the docs)
    }

    // Sources/WormholeKit/Wormhole.swift, `Wormhole.init(engine:coder:sender:logger:)`.
    // Compile-only: it writes into /tmp/example-wormhole.
    static func wormholeInitEngine() throws -> Wormhole {
        let wormhole = Wormhole(engine: try DirectoryEngine(directory: "/tmp/example-wormhole"))
        return wormhole  // (not in the docs)
    }

    // Sources/WormholeKit/Engine/WormholeEngine.swift, `WormholeEngine`.
    // Compile-only: it writes into /tmp/example-wormhole.
    static func wormholeEngineOverview() throws {
        let engine = try DirectoryEngine(directory: "/tmp/example-wormhole")
        let wormhole = Wormhole(engine: engine)
        try wormhole.queue("jobs").enqueue("first job")
    }

    // Sources/WormholeKit/Engine/DirectoryEngine.swift, `DirectoryEngine`.
    // Compile-only: it writes into /tmp/example-wormhole.
    static func directoryEngineOverview() throws -> Wormhole {
        let engine = try DirectoryEngine(directory: "/tmp/example-wormhole")
        let app = Wormhole(engine: engine, sender: "app")
        return app  // (not in the docs)
    }

    // Sources/WormholeKit/Engine/Transiting.swift, `Transiting`.
    static func transitingContract() throws {
        let transiting = InMemoryTransiting()
        let first = try transiting.writeMessage(Data("1".utf8), sender: "a", identifier: "x")
        let second = try transiting.writeMessage(Data("2".utf8), sender: "a", identifier: "x")
        #expect(second.sequence > first.sequence)
        #expect(try transiting.readMessage(identifier: "x")?.payload == Data("2".utf8))
        #expect(try transiting.identifiers() == ["x"])
        try transiting.deleteMessage(identifier: "x")
        #expect(try transiting.readMessage(identifier: "x") == nil)
    }

    // Sources/WormholeKit/Engine/Notifier.swift, `Notifier`.
    static func notifierContract(notifier: any Notifier) async throws {
        let (calls, call) = AsyncStream.makeStream(of: Void.self)
        let observation = try notifier.observe("mailbox.button") { call.yield() }
        try notifier.post("mailbox.button")
        for await _ in calls { break }  // the handler ran, soon after the post
        observation.cancel()  // and it runs no more once this returns
    }

    // Sources/WormholeKit/Mailbox/FileTransiting.swift, `FileTransiting`.
    // Compile-only: it needs /run/user/1000.
    static func fileTransitingOverview() throws -> Wormhole {
        let transiting = try FileTransiting(directory: "/run/user/1000/my-group/wormhole")
        let wormhole = Wormhole(
            transiting: transiting,
            notifier: try DirectoryNotifier(directory: transiting.directory)
        )
        return wormhole  // (not in the docs)
    }

    // Sources/WormholeKit/Mailbox/FileTransiting.swift, `FileTransiting.Options.shared(withGroup:synchronizesWrites:)`.
    // Compile-only: it needs the group wormhole-users and /run/my-daemon.
    static func fileTransitingOptionsShared() throws -> Wormhole {
        let staff = getgrnam("wormhole-users")!.pointee.gr_gid
        var configuration = Wormhole.Configuration()
        configuration.fileOptions = .shared(withGroup: staff)
        let wormhole = try Wormhole(directory: "/run/my-daemon/wormhole", configuration: configuration)
        return wormhole  // (not in the docs)
    }

    // Sources/WormholeKit/Mailbox/MessageListener.swift, `MessageListener`.
    final class WidgetModel {
        private var listener: MessageListener?
        func start(_ wormhole: Wormhole) throws {
            listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) { tap in
                print("tapped", tap.number)
            }
        }
    }

    // Sources/WormholeKit/Mailbox/Wormhole+MailboxListening.swift,
    // `Wormhole.listenForMessage(withIdentifier:as:deliveringCurrentMessage:on:errorHandler:listener:)`.
    static func listenForMessageOnMain(wormhole: Wormhole, label: Label) throws -> MessageListener {
        let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self, on: .main) { tap in
            MainActor.assumeIsolated { label.text = "\(tap.number)" }  // .main runs it on the main actor
        }
        return listener  // (not in the docs)
    }

    // Sources/WormholeKit/Mailbox/Wormhole+MailboxListening.swift,
    // `Wormhole.messages(withIdentifier:as:deliveringCurrentMessage:)`.
    // Compile-only: the loop listens until its task is cancelled.
    static func messagesAsASequence(wormhole: Wormhole) async throws {
        for try await tap in wormhole.messages(withIdentifier: "button", as: Tap.self) {
            print("tapped", tap.number)
        }
    }

    // Sources/WormholeKit/Mailbox/Wormhole+MailboxListening.swift,
    // `Wormhole.repostMessages(withIdentifier:to:as:deliveringCurrentMessage:on:errorHandler:)`.
    static func repostMessages(wormhole: Wormhole) throws -> (MessageListener, any NSObjectProtocol) {
        let reposting = try wormhole.repostMessages(withIdentifier: "button", to: .default)
        let token = NotificationCenter.default.addObserver(
            forName: Notification.Name("button"),
            object: nil,
            queue: nil
        ) { notification in
            print("button message", notification.object ?? "")  // the message as a Foundation JSON object
        }
        return (reposting, token)  // (not in the docs)
    }

    // Sources/WormholeKit/Live/Wormhole+Live.swift, `Wormhole.request(_:identifier:as:timeout:)`.
    static func request(wormhole: Wormhole) async throws -> Answer {
        let answer = try await wormhole.request(
            Query(term: "swift"),
            identifier: "lookup",
            as: Answer.self,
            timeout: .seconds(1)
        )
        return answer  // (not in the docs)
    }

    // Sources/WormholeKit/WormholeError.swift, `WormholeError`.
    static func wormholeError(wormhole: Wormhole) throws {
        do {
            let tap = try wormhole.message(withIdentifier: "button", as: Tap.self)
            print("tapped", tap?.number ?? 0)
        } catch {
            switch error.code {  // error is a WormholeError: every call in the `do` throws one
            case .decodingFailed: print("the mailbox holds a message of another type")
            default: throw error
            }
        }
    }

    // Sources/WormholeKit/JSONValue.swift, `JSONValue`.
    static func jsonValue(wormhole: Wormhole) throws {
        let message: JSONValue = ["kind": "tap", "count": 3, "at": [1.5, 2.5], "note": nil]
        try wormhole.passMessageObject(message, identifier: "button")

        if let received = try wormhole.message(withIdentifier: "button", as: JSONValue.self),
            received["kind"]?.stringValue == "tap"
        {
            print(received["count"]?.intValue ?? 0, received)  // 3 {"at":[1.5,2.5],"count":3,"kind":"tap","note":null}
        }
    }

    // Sources/WormholeKit/Queue/WormholeQueue.swift, `WormholeQueue`.
    static func wormholeQueueOverview(
        wormhole: Wormhole,
        perform: @escaping @Sendable (Job) throws -> Void
    ) throws -> QueueConsumer {
        let jobs = try wormhole.queue("jobs")
        try jobs.enqueue(Job(id: 1))  // in any process

        let worker = try jobs.consume(consumer: "worker", as: Job.self) { message in
            try perform(message.value)  // returning acknowledges; throwing retries it later
        }
        return worker  // (not in the docs)
    }

    // Sources/WormholeKit/Queue/QueueSequence.swift, `QueueSequence`.
    static func queueSequence(wormhole: Wormhole) async throws {
        let jobs = try await wormhole.queue("jobs").messages(consumer: "worker", as: String.self)
        for try await job in jobs {
            print(job.value)
            try await jobs.acknowledge(job)
            break
        }
    }

    // Sources/WormholeKit/Suite/WormholeSuite.swift, `WormholeSuite`.
    static func wormholeSuiteOverview(wormhole: Wormhole) throws -> (WormholeSuite, SuiteObserver) {
        let settings = try wormhole.suite("settings")
        try settings.set("dark", forKey: "theme", direction: "app→widget")
        try settings.update { values in  // several keys, atomically, across processes
            try values.set((values["count", as: Int.self] ?? 0) + 1, forKey: "count")
            try values.set("app", forKey: "updatedBy")
        }
        let observer = try settings.observe(keys: ["theme"]) { change in
            print(change.keys, "changed by", change.sender)  // other processes' changes; own ones are skipped
        }
        return (settings, observer)  // (not in the docs)
    }

    // Sources/WormholeKit/Suite/WormholeSuite.swift, `WormholeSuite.update(direction:_:)`.
    static func wormholeSuiteUpdate(settings: WormholeSuite) throws {
        try settings.update { values in
            try values.set((values["count", as: Int.self] ?? 0) + 1, forKey: "count")
        }
    }

    // Sources/WormholeKit/Transfer/WormholeTransfers.swift, `WormholeTransfers`.
    // Compile-only: it needs /tmp/report.pdf and /home/me.
    static func wormholeTransfersOverview(wormhole: Wormhole) throws -> (FileTransfer, QueueConsumer) {
        let exports = try wormhole.transfers("exports")
        let transfer = try exports.send(file: "/tmp/report.pdf", metadata: ["kind": "report"]) { progress in
            print(progress.fraction)  // for large files, as the copy goes
        }

        // In the receiving process:
        let receiver = try exports.receive(consumer: "viewer", into: "/home/me/inbox") { file in
            print("received", file.path)  // the file is now the receiver's, in its directory
        }
        return (transfer, receiver)  // (not in the docs)
    }

    // Sources/WormholeKit/Session/WormholeSession.swift, `WormholeSession`.
    // Compile-only: it needs /tmp/track.gpx, and the watch activated to reply.
    static func wormholeSessionOverview(
        wormhole: Wormhole
    ) async throws -> (SessionListener, [String: JSONValue]) {
        let session = try WormholeSession(wormhole: wormhole, name: "phone", counterpart: "watch")
        let contexts = session.onApplicationContext { update in print(update.changedKeys) }  // before activate()
        try session.activate()
        try session.updateApplicationContext(["face": "modular"])  // the watch gets it when it next activates
        let reply = try await session.sendMessage(["ping": 1])  // only while the watch is reachable
        try session.transferUserInfo(["steps": 4200])  // queued; in order and once
        try session.transferFile("/tmp/track.gpx", metadata: ["kind": "track"])
        return (contexts, reply)  // (not in the docs)
    }

    // Sources/WormholeKit/Session/SessionTransiting.swift, `Wormhole.init(session:transitingType:coder:)`.
    static func wormholeInitSession(wormhole: Wormhole) throws -> (WormholeSession, Wormhole, MessageListener) {
        let session = try WormholeSession(wormhole: wormhole, name: "phone", counterpart: "watch")
        let phone = Wormhole(session: session, transitingType: .sessionContext)
        let listener = try phone.listenForMessage(withIdentifier: "steps", as: Int.self) { print($0) }
        try session.activate()  // after the listeners, as MMWormhole asks
        try phone.passMessageObject(4200, identifier: "steps")  // errors are thrown, never dropped
        return (session, phone, listener)  // (not in the docs)
    }

    // MARK: - Doc comments of WormholeTesting

    // Sources/WormholeTesting/InMemoryEngine.swift, `InMemoryEngine`.
    static func inMemoryEngineOverview() async throws -> InMemoryEngine {
        let engine = InMemoryEngine()
        let app = Wormhole(engine: engine, sender: "app")
        let widget = Wormhole(engine: engine, sender: "widget")
        try app.queue("jobs").enqueue("first job")
        let jobs = try await widget.queue("jobs").messages(consumer: "worker", as: String.self)
        for try await job in jobs {
            print(job.value, "from", job.sender)  // "first job from app"
            try await jobs.acknowledge(job)
            break
        }
        return engine  // (not in the docs)
    }

    // Sources/WormholeTesting/InMemoryTransiting.swift, `InMemoryTransiting`.
    static func inMemoryTransitingOverview() throws -> MessageListener {
        let notifier = ManualNotifier()
        let wormhole = Wormhole(transiting: InMemoryTransiting(), notifier: notifier)
        let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self, on: .notifierThread) {
            tap in
            print("tapped", tap.number)
        }
        try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
        notifier.deliverPendingNotifications()  // the listener runs now, on this thread
        return listener  // (not in the docs)
    }

    // MARK: - Doc comments of WormholeStore

    // Sources/WormholeStore/SharedStore.swift, `SharedStore`.
    // Compile-only: it makes the store under the user's app-groups directory, and waits for other processes.
    static func sharedStoreOverview() async throws {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.create(table: "counter") { t in
                t.primaryKey("id", .integer)
                t.column("value", .integer).notNull()
            }
        }
        let store = try SharedStore(
            applicationGroupIdentifier: "group.com.example.app",
            name: "shared.sqlite",
            migrator: migrator,
            configuration: .init(author: "app")
        )
        try await store.write { db in try db.execute(sql: "UPDATE counter SET value = value + 1") }

        for try await transaction in store.remoteChanges(consumer: "app", tables: ["counter"]) {
            print(transaction.author, "changed", transaction.tableNames)
        }
    }
}

extension DocumentationExamples {
    // MARK: - Doc comments and articles of WormholePostgres's engine on a client

    // Sources/WormholePostgres/PostgresEngine.swift, `init(client:group:setsUpSchema:timeout:logger:)`, and
    // Sources/WormholePostgres/WormholePostgres.docc/AcrossHosts.md, "On a PostgresClient you already run".
    // Compile-only: it needs a server, and waits for jobs.
    static func postgresEngineOnAClient(configuration: PostgresClient.Configuration, logger: Logger) async throws {
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        try await withThrowingDiscardingTaskGroup { tasks in
            // On an executor of its own, the client opens connections even while the engine's calls block threads.
            tasks.addTask(executorPreference: PostgresClientExecutor.shared) { await client.run() }
            let engine = try await PostgresEngine(client: client, group: "group.com.example.app")
            defer {
                engine.close()  // first: the engine stops borrowing and gives its connections back
                tasks.cancelAll()
            }
            let wormhole = Wormhole(engine: engine, sender: "worker-1")
            for try await job in try await wormhole.queue("jobs").messages(consumer: "worker-1", as: String.self) {
                print("job:", job.value)
                if job.value == "last" { break }
            }
        }
    }

    // MARK: - Doc comments and articles of WormholePostgres's store

    // Sources/WormholePostgres/Store/PostgresStore.swift, `PostgresStore`.
    // Compile-only: it needs a server, and waits for other processes.
    static func postgresStoreOverview() async throws {
        let engine = try PostgresEngine(url: "postgres://app@db.example.com/app", group: "group.com.example.app")
        let store = try PostgresStore(
            engine: engine,
            name: "counters",
            migrations: [.init("v1", sql: "CREATE TABLE counter (id integer PRIMARY KEY, value bigint NOT NULL)")],
            configuration: .init(author: "host-a")
        )
        try await store.write { db in try db.query("UPDATE counter SET value = value + 1 WHERE id = 1") }

        for try await transaction in store.remoteChanges(consumer: "host-a", tables: ["counter"]) {
            print(transaction.author, "changed", transaction.tableNames)
        }
    }

    // Sources/WormholePostgres/WormholePostgres.docc/SharingAStoreAcrossHosts.md, "Open a store and use it".
    // Compile-only: it needs a server, and waits for other processes.
    static func sharingAStoreAcrossHostsOpen() async throws {
        // The URL, password included, comes from the environment rather than from the code.
        let url = ProcessInfo.processInfo.environment["WORMHOLE_POSTGRES_URL"] ?? "postgres://app@localhost/app"
        let engine = try PostgresEngine(url: url, group: "group.com.example.app")
        let store = try PostgresStore(
            engine: engine,
            name: "counters",
            migrations: [
                .init(
                    "v1",
                    sql: "CREATE TABLE counter (id integer PRIMARY KEY, value bigint NOT NULL)",
                    "INSERT INTO counter (id, value) VALUES (1, 0)"  // not recorded: the table gets its trigger after
                )
            ],
            configuration: .init(author: "worker-a")
        )

        let step: Int64 = 1
        try await store.write { db in
            try db.query("UPDATE counter SET value = value + \(step) WHERE id = 1")  // `step` travels as a parameter
        }
        let value = try await store.read { db in
            try db.query("SELECT value FROM counter WHERE id = 1")[0].decode(Int64.self)
        }
        print("counter:", value)

        for try await transaction in store.remoteChanges(consumer: "worker-a", tables: ["counter"]) {
            // merge: reload the rows whose keys changed
            print(transaction.author, transaction.tables["counter"]?.updated.map(\.integerValue) ?? [])
        }
    }
}

/// Runs examples of the documentation end to end, on the in-memory engine or a temporary directory, and checks
/// what they did.
@Suite("Documentation examples", .timeLimit(.minutes(1)))
struct DocumentationExamplesTests {
    typealias Examples = DocumentationExamples

    /// Polls `condition` every 5 ms for up to 10 seconds; returns whether it held.
    private func waitUntil(_ condition: () throws -> Bool) async rethrows -> Bool {
        for _ in 0..<2000 {
            if try condition() { return true }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return try condition()
    }

    @Test("The examples run as written and do what their comments say")
    func examplesRun() async throws {
        // Getting started: pass and read, listen, and the test double.
        let mailboxes = Wormhole(engine: InMemoryEngine(), sender: "app")
        #expect(try Examples.gettingStartedPassAndRead(wormhole: mailboxes) == 1)
        let listener = try Examples.gettingStartedListen(wormhole: mailboxes)
        #expect(!listener.isCancelled)
        let (notifier, testListener) = try Examples.gettingStartedTestYourCode()
        #expect(notifier.postedNames == ["mailbox.button"])
        #expect(!testListener.isCancelled)

        // WormholeQueue's overview: the consumer gets the job enqueued before it started.
        let performed = Mutex<[Int]>([])
        let queueWormhole = Wormhole(engine: InMemoryEngine())
        let worker = try Examples.wormholeQueueOverview(wormhole: queueWormhole) { job in
            performed.withLock { $0.append(job.id) }
        }
        #expect(await waitUntil { performed.withLock { $0 } == [1] })
        let end = try queueWormhole.queue("jobs").status().endOffset
        #expect(await waitUntil { worker.position == end }, "acknowledged")
        worker.cancel()

        // Durable queues: enqueue, then a batch consumer gets that job and the batch after it, in order.
        let batchWormhole = Wormhole(engine: InMemoryEngine())
        let jobs = try Examples.durableQueuesEnqueue(wormhole: batchWormhole)
        let batches = Mutex<[[Int]]>([])
        let pending = [Examples.Job(id: 2), Examples.Job(id: 3)]
        let batchWorker = try Examples.durableQueuesBatches(jobs: jobs, pending: pending) { batch in
            batches.withLock { $0.append(batch.map(\.id)) }
        }
        #expect(await waitUntil { batches.withLock { $0.flatMap { $0 } } == [1, 2, 3] })
        #expect(batches.withLock { $0.count } == 1, "the three messages were there at once: one batch")
        batchWorker.cancel()

        // Retries: the first attempt of job 1 fails, its second (200 ms later) succeeds; a job that always fails
        // ends, after 3 attempts, in the dead letters, which the example requeues.
        let retryWormhole = Wormhole(engine: InMemoryEngine())
        let retryJobs = try retryWormhole.queue("jobs")
        try retryJobs.enqueue(contentsOf: [Examples.Job(id: 1), Examples.Job(id: 13)])
        let tries = Mutex<[Int]>([])
        struct NotYet: Error {}
        let retrying = try Examples.durableQueuesRetries(jobs: retryJobs) { job in
            let count = tries.withLock { tries in
                tries.append(job.id)
                return tries.filter { $0 == job.id }.count
            }
            if job.id == 13 || count == 1 { throw NotYet() }
        }
        #expect(await waitUntil { (try? retryJobs.deadLetters(consumer: "worker").count) == 1 })
        #expect(tries.withLock { $0.filter { $0 == 1 }.count } == 2, "job 1 succeeded at its second attempt")
        #expect(tries.withLock { $0.filter { $0 == 13 }.count } == 3, "job 13 had 3 attempts")
        try Examples.durableQueuesDeadLetters(jobs: retryJobs)
        #expect(await waitUntil { tries.withLock { $0.filter { $0 == 13 }.count } == 4 }, "requeued")
        retrying.cancel()

        // Delayed and expiring messages: two scheduled, one of them long expired; a consumer started now gets neither
        // yet (the one not expired is 30 s away), and the expired one is a dead letter.
        let scheduleWormhole = Wormhole(engine: InMemoryEngine())
        let scheduled = try scheduleWormhole.queue("jobs")
        let early = Mutex<[Int]>([])
        let scheduledWorker = try scheduled.consume(consumer: "worker", as: Examples.Job.self) { message in
            early.withLock { $0.append(message.value.id) }
        }
        try Examples.durableQueuesSchedule(jobs: scheduled, nineOClock: Date(timeIntervalSinceNow: -3600))
        #expect(await waitUntil { (try? scheduled.deadLetters(consumer: "worker").list().map(\.reason)) == [.expired] })
        #expect(early.withLock { $0 }.isEmpty, "the delayed one waits, the expired one is never handled")
        #expect(try scheduled.status().consumers.first?.scheduled == 1)
        scheduledWorker.cancel()

        // QueueSequence's example acknowledges the message it breaks after.
        let sequenceWormhole = Wormhole(engine: InMemoryEngine())
        try sequenceWormhole.queue("jobs").enqueue("first job")
        try await Examples.queueSequence(wormhole: sequenceWormhole)
        #expect(try sequenceWormhole.queue("jobs").status().consumers.map(\.lagMessages) == [0])

        // InMemoryEngine's overview: the widget's worker took the app's job, and acknowledged it.
        let engine = try await Examples.inMemoryEngineOverview()
        let status = try Wormhole(engine: engine).queue("jobs").status()
        #expect(status.consumers.map(\.name) == ["worker"])
        #expect(status.consumers.map(\.lagMessages) == [0])

        // WormholeSuite's overview, then its update example: two updates of "count".
        let suiteWormhole = Wormhole(engine: InMemoryEngine(), sender: "app")
        let (settings, observer) = try Examples.wormholeSuiteOverview(wormhole: suiteWormhole)
        try Examples.wormholeSuiteUpdate(settings: settings)
        #expect(try settings.value(forKey: "theme", as: String.self) == "dark")
        #expect(try settings.value(forKey: "count", as: Int.self) == 2)
        #expect(try settings.value(forKey: "updatedBy", as: String.self) == "app")
        observer.cancel()

        // JSONValue's example passes a JSON value that reads back whole.
        let jsonWormhole = Wormhole(engine: InMemoryEngine())
        try Examples.jsonValue(wormhole: jsonWormhole)
        let json = try #require(try jsonWormhole.message(withIdentifier: "button", as: JSONValue.self))
        #expect(json["count"]?.intValue == 3)
        #expect(json["at"]?[1]?.doubleValue == 2.5)
        #expect(json["note"]?.isNull == true)

        // WormholeError's example catches a message of another type.
        try Examples.wormholeError(wormhole: jsonWormhole)

        // A request answered by another wormhole of the same engine.
        let liveEngine = InMemoryEngine()
        let responder = try Wormhole(engine: liveEngine, sender: "widget").respondToRequests(
            withIdentifier: "lookup",
            as: Examples.Query.self
        ) { query in Examples.Answer(count: query.term.count) }
        #expect(try await Examples.request(wormhole: Wormhole(engine: liveEngine, sender: "app")).count == 5)
        responder.cancel()

        // Reposting: the message reaches NotificationCenter observers as a Foundation JSON object.
        let repostWormhole = Wormhole(engine: InMemoryEngine())
        let (reposting, token) = try Examples.repostMessages(wormhole: repostWormhole)
        let reposted = Mutex<[Int]>([])
        let check = NotificationCenter.default.addObserver(
            forName: Notification.Name("button"),
            object: nil,
            queue: nil
        ) { notification in
            if let number = (notification.object as? [String: Any])?["number"] as? Int {
                reposted.withLock { $0.append(number) }
            }
        }
        try repostWormhole.passMessageObject(Examples.Tap(number: 7), identifier: "button")
        #expect(await waitUntil { reposted.withLock { $0 } == [7] })
        reposting.cancel()
        NotificationCenter.default.removeObserver(token)
        NotificationCenter.default.removeObserver(check)

        // Live messages and requests: a listener reached, nobody listening caught, a request answered.
        let live = Wormhole(engine: InMemoryEngine())
        let (cursorListener, reached) = try Examples.liveSendAndListen(wormhole: live)
        #expect(reached == 1)
        cursorListener.cancel()
        Examples.liveNobodyListening(wormhole: live)
        await Examples.liveRequestOutcomes(wormhole: live)
        let (lookup, count) = try await Examples.liveRequestsAndReplies(wormhole: live)
        #expect(count == 3)
        lookup.cancel()
        let (channelListener, channelResponder, length) = try await Examples.liveChannel(wormhole: live)
        #expect(length == 5)
        channelListener.cancel()
        channelResponder.cancel()

        // Shared suites: set and read, update, observe, catch up.
        let suites = Wormhole(engine: InMemoryEngine(), sender: "app")
        let (theme, everything) = try Examples.sharedSuitesSetAndRead(wormhole: suites)
        #expect(theme == "dark")
        #expect(everything.keys == ["count", "theme"])
        #expect(try suites.suite("settings").value(forKey: "count", as: Int.self) == nil, "removed")
        try Examples.sharedSuitesUpdate(wormhole: suites)
        #expect(try suites.suite("settings").value(forKey: "count", as: Int.self) == 1)
        let themeObserver = try Examples.sharedSuitesObserve(wormhole: suites)
        let catchingUp = try Examples.sharedSuitesCatchingUp(wormhole: suites)
        let (reposter, themeToken) = try Examples.sharedSuitesRepost(wormhole: suites)
        let reposts = Mutex<[String]>([])
        let themeCheck = NotificationCenter.default.addObserver(
            forName: Notification.Name("theme"),
            object: nil,
            queue: nil
        ) { notification in
            if let theme = notification.object as? String { reposts.withLock { $0.append(theme) } }
        }
        try Wormhole(engine: suites.engine, sender: "widget").suite("settings").set("light", forKey: "theme")
        #expect(await waitUntil { reposts.withLock { $0 } == ["light"] }, "another process's change is reposted")
        for observer in [themeObserver, catchingUp, reposter] { observer.cancel() }
        NotificationCenter.default.removeObserver(themeToken)
        NotificationCenter.default.removeObserver(themeCheck)

        // Migrating from MMWormhole: pass, read, clear.
        let migrated = Wormhole(engine: InMemoryEngine())
        #expect(try Examples.migratingPassReadClear(wormhole: migrated) == 1)
        #expect(try migrated.messageData(withIdentifier: "button") == nil, "cleared")

        // The Transiting and Notifier contracts, as their doc comments state them.
        try Examples.transitingContract()
        try await Examples.notifierContract(notifier: InMemoryNotifier())
        _ = try Examples.inMemoryTransitingOverview()
        try Examples.wormholeTestingOverview()

        // Testing your code: each example checks itself.
        try Examples.testingGiveYourCodeAWormhole()
        try await Examples.testingEveryModeInMemory()
        try Examples.testingDecideWhenListenersRun()
        try Examples.testingMailboxesAlone()
        try Examples.testingDirectoryEngine()
    }

    @Test("The session examples run as written, a phone and a watch on one in-memory engine")
    func sessionExamplesRun() async throws {
        // The overview: two sessions, the names mirrored.
        let (onePhone, oneWatch) = try Examples.sessionsOverview(wormhole: Wormhole(engine: InMemoryEngine()))
        #expect(onePhone.name == "phone" && onePhone.counterpart == "watch")
        #expect(oneWatch.name == "watch" && oneWatch.counterpart == "phone")

        // A message handler tested alone: the example checks itself.
        try Examples.sessionsTestingAMessageHandler()

        // Activation: the watch, its handlers first; then the phone.
        let engine = InMemoryEngine()
        let watchWormhole = Wormhole(engine: engine, sender: "watch")
        let (watch, watchHandlers) = try Examples.sessionsActivation(wormhole: watchWormhole)
        #expect(watch.activationState == .activated)
        let phone = try WormholeSession(
            wormhole: Wormhole(engine: engine, sender: "phone"),
            name: "phone",
            counterpart: "watch"
        )
        try phone.activate()

        // The application context reaches the watch, whose handlers are there.
        let faces = try Examples.sessionsApplicationContext(phone: phone, watch: watch)
        let context: [String: JSONValue] = ["face": "modular", "nextEvent": "standup at 9:10"]
        #expect(try phone.applicationContext == context)
        #expect(await waitUntil { (try? watch.receivedApplicationContext) == context })

        // A message and its reply.
        let (replier, reply) = await Examples.sessionsMessages(phone: phone, watch: watch)
        #expect(reply == ["pong": 1])

        // User info: whether the cancellation came in time or not, nothing stays outstanding.
        let (finished, steps) = try Examples.sessionsUserInfo(phone: phone, watch: watch)
        #expect(await waitUntil { (try? phone.outstandingUserInfoTransfers)?.isEmpty == true })

        let reachability = Examples.sessionsReachability(phone: phone)
        let errors = Examples.sessionsErrors(watch: watch)

        // MMWormhole's form, with a watch session of its own (one session of a name at a time): the tap passed by
        // the phone reaches the watch's mailbox.
        watch.deactivate()
        let (tapsSession, taps, tapListener, phoneTaps) = try Examples.sessionsMMWormholeForm(
            wormhole: watchWormhole,
            phone: phone
        )
        #expect(try phone.applicationContext["button"] == ["number": 1])
        #expect(await waitUntil { (try? taps.message(withIdentifier: "button", as: Examples.Tap.self))?.number == 1 })

        // Wormhole.init(session:transitingType:coder:)'s example: the pass is a key of the context sent.
        let (stepsSession, stepsWormhole, stepsListener) = try Examples.wormholeInitSession(
            wormhole: Wormhole(engine: InMemoryEngine(), sender: "phone")
        )
        #expect(try stepsSession.applicationContext == ["steps": 4200])

        for listener in watchHandlers + [faces, replier, finished, steps, reachability, errors] { listener.cancel() }
        tapListener.cancel()
        stepsListener.cancel()
        for session in [tapsSession, phone, stepsSession] { session.deactivate() }
        withExtendedLifetime((phoneTaps, stepsWormhole)) {}
    }
}
