// Members, their devices and audiences in DynamoDB. Three tables, string attributes only, so
// items are marshalled by hand (no document client to pin):
//   <prefix>-members   org (hash), member (range), profile (JSON text)
//   <prefix>-devices   owner "org/member" (hash), token (range), kind, state live|dead
//   <prefix>-audience  author "org/author" (hash), member (range): who hears an author
// The sender reads devices at send time, so a device registered or found dead after the
// broadcast is seen by every job still to run.
import {
  BatchWriteItemCommand,
  CreateTableCommand,
  DescribeTableCommand,
  DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  QueryCommand,
  UpdateItemCommand,
} from '@aws-sdk/client-dynamodb'
import { tableNames } from './config.mjs'
import { pause } from './lifecycle.mjs'

const KEYS = {
  members: ['org', 'member'],
  devices: ['owner', 'token'],
  audience: ['author', 'member'],
}

const owner = (org, member) => `${org}/${member}`

export class Store {
  constructor(config) {
    this.client = new DynamoDBClient({ region: config.region, endpoint: config.dynamodbEndpoint })
    this.tables = tableNames(config.prefix)
  }

  // Each role creates what is missing at start; two roles starting at once race, and the one
  // that loses sees ResourceInUseException, which is as good as having made it.
  async ensureTables() {
    for (const [name, [hash, range]] of Object.entries(KEYS)) {
      const TableName = this.tables[name]
      try {
        await this.client.send(
          new CreateTableCommand({
            TableName,
            BillingMode: 'PAY_PER_REQUEST',
            AttributeDefinitions: [
              { AttributeName: hash, AttributeType: 'S' },
              { AttributeName: range, AttributeType: 'S' },
            ],
            KeySchema: [
              { AttributeName: hash, KeyType: 'HASH' },
              { AttributeName: range, KeyType: 'RANGE' },
            ],
          }),
        )
      } catch (err) {
        if (err.name !== 'ResourceInUseException') throw err
      }
      for (let i = 0; ; i++) {
        const { Table } = await this.client.send(new DescribeTableCommand({ TableName }))
        if (Table.TableStatus === 'ACTIVE') break
        if (i > 300) throw new Error(`table ${TableName} still ${Table.TableStatus}`)
        await pause(100)
      }
    }
  }

  async putProfile(org, member, profile) {
    await this.client.send(
      new PutItemCommand({
        TableName: this.tables.members,
        Item: { org: { S: org }, member: { S: member }, profile: { S: JSON.stringify(profile) } },
      }),
    )
  }

  // The profile, or null when the member never set one.
  async profile(org, member) {
    const { Item } = await this.client.send(
      new GetItemCommand({
        TableName: this.tables.members,
        Key: { org: { S: org }, member: { S: member } },
        ConsistentRead: true,
      }),
    )
    return Item ? JSON.parse(Item.profile.S) : null
  }

  // Registering a token (again) makes it live: an app reinstalled gets a token APNs may hand
  // out again, and the member asked for pushes on it.
  async putDevice(org, member, token, kind) {
    await this.client.send(
      new PutItemCommand({
        TableName: this.tables.devices,
        Item: {
          owner: { S: owner(org, member) },
          token: { S: token },
          kind: { S: kind },
          state: { S: 'live' },
          registeredAt: { S: new Date().toISOString() },
        },
      }),
    )
  }

  async devices(org, member) {
    const found = []
    let ExclusiveStartKey
    do {
      const page = await this.client.send(
        new QueryCommand({
          TableName: this.tables.devices,
          KeyConditionExpression: '#o = :o',
          ExpressionAttributeNames: { '#o': 'owner' },
          ExpressionAttributeValues: { ':o': { S: owner(org, member) } },
          ConsistentRead: true,
          ExclusiveStartKey,
        }),
      )
      for (const item of page.Items) {
        found.push({ token: item.token.S, kind: item.kind.S, state: item.state.S, deadReason: item.deadReason?.S })
      }
      ExclusiveStartKey = page.LastEvaluatedKey
    } while (ExclusiveStartKey)
    return found
  }

  // Only a device still there is marked: a token the member removed meanwhile stays removed.
  async markDead(org, member, token, reason) {
    try {
      await this.client.send(
        new UpdateItemCommand({
          TableName: this.tables.devices,
          Key: { owner: { S: owner(org, member) }, token: { S: token } },
          UpdateExpression: 'SET #s = :dead, deadAt = :at, deadReason = :why',
          ConditionExpression: 'attribute_exists(#t)',
          ExpressionAttributeNames: { '#s': 'state', '#t': 'token' },
          ExpressionAttributeValues: {
            ':dead': { S: 'dead' },
            ':at': { S: new Date().toISOString() },
            ':why': { S: reason },
          },
        }),
      )
    } catch (err) {
      if (err.name !== 'ConditionalCheckFailedException') throw err
    }
  }

  // BatchWriteItem takes 25 items; what DynamoDB leaves unprocessed is written again with a
  // growing pause, four batches in flight.
  async addAudience(org, author, members) {
    const batches = []
    for (let i = 0; i < members.length; i += 25) batches.push(members.slice(i, i + 25))
    const write = async (batch) => {
      let requests = batch.map((m) => ({
        PutRequest: { Item: { author: { S: owner(org, author) }, member: { S: m } } },
      }))
      for (let attempt = 0; requests.length; attempt++) {
        if (attempt > 8) throw new Error('audience writes left unprocessed after 8 attempts')
        if (attempt) await pause(50 * 2 ** attempt)
        const { UnprocessedItems } = await this.client.send(
          new BatchWriteItemCommand({ RequestItems: { [this.tables.audience]: requests } }),
        )
        requests = UnprocessedItems?.[this.tables.audience] || []
      }
    }
    let next = 0
    const worker = async () => {
      while (next < batches.length) await write(batches[next++])
    }
    await Promise.all([worker(), worker(), worker(), worker()])
  }

  // The author's audience a page at a time, so a celebrity's fan-out never holds it whole.
  async *audience(org, author, pageSize = 1000) {
    let ExclusiveStartKey
    do {
      const page = await this.client.send(
        new QueryCommand({
          TableName: this.tables.audience,
          KeyConditionExpression: '#a = :a',
          ExpressionAttributeNames: { '#a': 'author' },
          ExpressionAttributeValues: { ':a': { S: owner(org, author) } },
          Limit: pageSize,
          ExclusiveStartKey,
        }),
      )
      yield page.Items.map((item) => item.member.S)
      ExclusiveStartKey = page.LastEvaluatedKey
    } while (ExclusiveStartKey)
  }

  close() {
    this.client.destroy()
  }
}
