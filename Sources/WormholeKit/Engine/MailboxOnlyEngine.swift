import Foundation
import Logging

/// The engine of a wormhole made from a transiting and a notifier that keep no directory: mailboxes only.
final class MailboxOnlyEngine: WormholeEngine {
    let transiting: any Transiting
    let notifier: any Notifier

    init(transiting: any Transiting, notifier: any Notifier) {
        self.transiting = transiting
        self.notifier = notifier
    }

    var description: String { "mailboxes only, on \(type(of: transiting))" }

    func queueLog(_ identifier: String, sender: String, retention: Duration) throws(WormholeError) -> any QueueLog {
        throw unsupported("queues", identifier: identifier)
    }

    func suiteStore(_ name: String) throws(WormholeError) -> any SuiteStore {
        throw unsupported("suites", identifier: name)
    }

    func liveTransport(sender: String) throws(WormholeError) -> any LiveTransport {
        throw unsupported("live messages")
    }

    func transferStaging(_ identifier: String) throws(WormholeError) -> any TransferStaging {
        throw unsupported("file transfers", identifier: identifier)
    }
}
