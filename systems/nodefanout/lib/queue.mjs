// The four SQS queues: <prefix>-events (broadcasts, API -> router), <prefix>-jobs (one job per
// recipient, router -> sender), <prefix>-jobs-dead (a job received 3 times without a final
// outcome, by SQS's redrive policy) and <prefix>-quarantine (jobs and events that cannot be
// read or carry a malformed id: set aside, never sent, for a person to look at).
import {
  ChangeMessageVisibilityCommand,
  CreateQueueCommand,
  DeleteMessageCommand,
  GetQueueAttributesCommand,
  ReceiveMessageCommand,
  SendMessageBatchCommand,
  SendMessageCommand,
  SQSClient,
} from '@aws-sdk/client-sqs'
import { queueNames } from './config.mjs'
import { pause } from './lifecycle.mjs'

export const MAX_RECEIVES = 3
// SQS refuses a visibility beyond 12 hours after a receive.
export const MAX_VISIBILITY_S = 43200
export const MAX_DELAY_S = 900

export class Queues {
  constructor(config) {
    this.client = new SQSClient({ region: config.region, endpoint: config.sqsEndpoint })
    this.names = queueNames(config.prefix)
    this.urls = {}
  }

  // Every role creates all four with the same attributes (CreateQueue is idempotent only for
  // equal attributes): the sender's own visibility timeout is asked for on each receive.
  async ensure() {
    const make = async (key, Attributes = {}) => {
      const { QueueUrl } = await this.client.send(new CreateQueueCommand({ QueueName: this.names[key], Attributes }))
      this.urls[key] = QueueUrl
    }
    await make('dead', { MessageRetentionPeriod: '1209600' })
    await make('quarantine', { MessageRetentionPeriod: '1209600' })
    const { Attributes } = await this.client.send(
      new GetQueueAttributesCommand({ QueueUrl: this.urls.dead, AttributeNames: ['QueueArn'] }),
    )
    await make('jobs', {
      VisibilityTimeout: '30',
      RedrivePolicy: JSON.stringify({ deadLetterTargetArn: Attributes.QueueArn, maxReceiveCount: String(MAX_RECEIVES) }),
    })
    await make('events', { VisibilityTimeout: '60' })
  }

  // Up to `max` messages, long-polling `waitS`; [] when the signal aborts the poll.
  async receive(key, { max = 10, waitS = 2, visibilityS, signal } = {}) {
    try {
      const { Messages } = await this.client.send(
        new ReceiveMessageCommand({
          QueueUrl: this.urls[key],
          MaxNumberOfMessages: max,
          WaitTimeSeconds: waitS,
          VisibilityTimeout: visibilityS,
          MessageSystemAttributeNames: ['ApproximateReceiveCount'],
        }),
        { abortSignal: signal },
      )
      return (Messages || []).map((m) => ({
        id: m.MessageId,
        body: m.Body,
        handle: m.ReceiptHandle,
        receives: Number(m.Attributes?.ApproximateReceiveCount || 1),
        receivedAt: Date.now(),
      }))
    } catch (err) {
      if (signal?.aborted) return []
      throw err
    }
  }

  async send(key, body, attributes = {}) {
    const MessageAttributes = Object.fromEntries(
      Object.entries(attributes).map(([k, v]) => [k, { DataType: 'String', StringValue: String(v) }]),
    )
    await this.client.send(new SendMessageCommand({ QueueUrl: this.urls[key], MessageBody: body, MessageAttributes }))
  }

  // Bodies in batches of 10; entries SQS fails are sent again, with a growing pause.
  async sendBatch(key, bodies) {
    let entries = bodies.map((MessageBody, i) => ({ Id: String(i), MessageBody }))
    for (let attempt = 0; entries.length; attempt++) {
      if (attempt > 6) throw new Error(`${entries.length} messages refused by SQS after 6 attempts`)
      if (attempt) await pause(100 * 2 ** attempt)
      const { Failed } = await this.client.send(new SendMessageBatchCommand({ QueueUrl: this.urls[key], Entries: entries }))
      const failed = new Set((Failed || []).map((f) => f.Id))
      entries = entries.filter((e) => failed.has(e.Id))
    }
  }

  async delete(key, message) {
    await this.client.send(new DeleteMessageCommand({ QueueUrl: this.urls[key], ReceiptHandle: message.handle }))
  }

  // A job put off for `seconds`: a new copy, delayed (at most SQS's 15 minutes; a longer wait is
  // put off again when it comes back), then the original deleted. Not a longer visibility
  // timeout: that keeps the receive count, and a job deferred twice under redelivery would land
  // in the dead-letter queue with its quiet window not yet over. If the delete fails both come
  // back, and the dedup claim sends one.
  async defer(key, message, seconds) {
    const DelaySeconds = Math.max(0, Math.min(Math.ceil(seconds), MAX_DELAY_S))
    await this.client.send(new SendMessageCommand({ QueueUrl: this.urls[key], MessageBody: message.body, DelaySeconds }))
    await this.delete(key, message)
  }

  // The message comes back after `seconds` (capped where SQS would refuse it).
  async hide(key, message, seconds) {
    const held = (Date.now() - message.receivedAt) / 1000
    const VisibilityTimeout = Math.max(0, Math.min(Math.ceil(seconds), MAX_VISIBILITY_S - Math.ceil(held) - 5))
    await this.client.send(
      new ChangeMessageVisibilityCommand({ QueueUrl: this.urls[key], ReceiptHandle: message.handle, VisibilityTimeout }),
    )
  }

  close() {
    this.client.destroy()
  }
}
